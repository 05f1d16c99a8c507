"""Recording stand-in for Habana's ``habana_frameworks`` package (tests only).

Every function the runtime calls appends ``(name, details)`` to ``_calls`` and behaves plausibly
on CPU, so the HPU code path runs for real against CPU tensors.
"""
from __future__ import annotations

import atexit
import json
import os

_calls: list = []


def _write_log(prefix: str) -> None:
    with open(f"{prefix}.rank{os.environ.get('RANK', '0')}.json", "w") as f:
        json.dump(_calls, f, default=str)


# A rank run in its own process (through the launcher) leaves its call log here for the test.
if os.environ.get("HPU_STAND_IN_LOG"):
    atexit.register(_write_log, os.environ["HPU_STAND_IN_LOG"])


def record(name: str, **details) -> None:
    _calls.append((name, details))
