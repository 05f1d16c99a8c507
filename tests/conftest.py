"""Fixtures shared across test folders."""

# hpu_stand_in: the recording habana_frameworks stand-in (tests/standin), for tests named "stand_in".
pytest_plugins = ["tests.standin.fixture"]
