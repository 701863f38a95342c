"""``ts.protocol``."""
