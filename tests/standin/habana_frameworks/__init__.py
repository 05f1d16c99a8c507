"""Recording stand-in for Habana's ``habana_frameworks`` package (tests only).

Every function the runtime calls appends ``(name, details)`` to ``_calls``. The stand-in is as
strict as the bridge where the bridge is strict: its tensors report device "hpu" and refuse to mix
with CPU tensors, hccl serves hpu tensors only, lazy-only APIs do nothing (or do not exist) in
eager mode, and import-time settings are frozen when habana_frameworks.torch first loads. Each
module names the bridge source (HabanaAI/gaudi-pytorch-bridge 1.19) it follows. The arithmetic
runs on the CPU underneath (tests/standin/hpu_stand_in_device.py).
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
