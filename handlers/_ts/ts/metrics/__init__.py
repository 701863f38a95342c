"""``ts.metrics``."""
