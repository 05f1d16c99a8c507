"""``hpu_stand_in`` fixture: the recording habana_frameworks stand-in, importable for one test.

Tests import it (``from tests.standin.fixture import hpu_stand_in``); it yields the call log.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

STAND_IN_DIR = str(Path(__file__).resolve().parent)


def _purge() -> None:
    """Forget the stand-in bridge, as a new process would: the next import loads it afresh. The
    device itself (hpu_stand_in_device) stays registered with torch, which cannot undo that."""
    for name in [m for m in sys.modules if m == "habana_frameworks" or m.startswith("habana_frameworks.")]:
        del sys.modules[name]
    import torch

    if "hpu" in vars(torch):  # habana_frameworks.torch.core registers itself as torch.hpu
        delattr(torch, "hpu")
    sys.modules.pop("torch.hpu", None)
    device = sys.modules.get("hpu_stand_in_device")
    if device is not None:
        device.activate(False)


def _written(key: str) -> bool:
    return key.startswith("PT_HPU_") or key == "PT_ENABLE_INT64_SUPPORT"


@pytest.fixture
def hpu_stand_in(monkeypatch):
    _purge()
    # The runtime writes PT_HPU_* (and PT_ENABLE_INT64_SUPPORT) into os.environ: give each test a
    # clean slate and restore after.
    saved = {k: v for k, v in os.environ.items() if _written(k)}
    for key in saved:
        del os.environ[key]
    monkeypatch.syspath_prepend(STAND_IN_DIR)
    import habana_frameworks

    try:
        yield habana_frameworks._calls
    finally:
        _purge()
        for key in [k for k in os.environ if _written(k)]:
            del os.environ[key]
        os.environ.update(saved)
