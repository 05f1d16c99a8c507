"""Stand-in for habana_frameworks.torch.core: records the env it was imported under, and mark_step."""
from __future__ import annotations

import os

from habana_frameworks import record

_LISTS = ("PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST", "PT_HPU_AUTOCAST_FP32_OPS_LIST")


def _read(path):
    try:
        with open(path) as f:
            return f.read()
    except (OSError, TypeError):
        return None


# The real bridge reads these once, at import: the tests assert they were set (and the op-list
# files written) before it.
record("core.import", PT_HPU_LAZY_MODE=os.environ.get("PT_HPU_LAZY_MODE"),
       **{var: os.environ.get(var) for var in _LISTS},
       op_lists={var: _read(os.environ.get(var)) for var in _LISTS})


def mark_step() -> None:
    record("mark_step")
