"""A recording stand-in for Habana's habana_frameworks (see fixture.py)."""
