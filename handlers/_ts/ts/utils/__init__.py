"""``ts.utils``."""
