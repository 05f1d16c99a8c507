"""Fixtures shared across test folders."""

import importlib.util
import sys
from pathlib import Path

STAND_IN_DIR = str(Path(__file__).resolve().parent / "standin")

# hpu_stand_in: the habana_frameworks stand-in (tests/standin), for tests named "stand_in".
pytest_plugins = ["tests.standin.fixture"]


def pytest_configure(config):
    # The stand-in's HPU device must be registered with torch before anything in this process asks
    # torch for its accelerator (torch caches the answer's hooks). It stays inactive, and invisible
    # to other tests, until a test loads the stand-in bridge. Registered under its top-level name,
    # the one the stand-in's modules import it by.
    spec = importlib.util.spec_from_file_location("hpu_stand_in_device", f"{STAND_IN_DIR}/hpu_stand_in_device.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["hpu_stand_in_device"] = module
    spec.loader.exec_module(module)
    module.register_device()
