"""Recording stand-in for Habana's ``habana_frameworks`` package (tests only).

Every function the runtime calls appends ``(name, details)`` to ``_calls`` and behaves plausibly
on CPU, so the HPU code path runs for real against CPU tensors.
"""
from __future__ import annotations

import atexit
import json
import os

_calls: list = []

# A rank run in its own process (through the launcher) leaves its call log here for the test.
_LOG_PREFIX = os.environ.get("HPU_STAND_IN_LOG")
if _LOG_PREFIX:
    atexit.register(lambda: open(f"{_LOG_PREFIX}.rank{os.environ.get('RANK', '0')}.json", "w")
                    .write(json.dumps(_calls, default=str)))


def record(name: str, **details) -> None:
    _calls.append((name, details))
