"""Stand-in for habana_frameworks.torch.core: records the env it was imported under, and mark_step."""
from __future__ import annotations

import os

from habana_frameworks import record

# The real bridge reads these once, at import: the tests assert they were set before it.
record("core.import", PT_HPU_LAZY_MODE=os.environ.get("PT_HPU_LAZY_MODE"),
       PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST=os.environ.get("PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST"),
       PT_HPU_AUTOCAST_FP32_OPS_LIST=os.environ.get("PT_HPU_AUTOCAST_FP32_OPS_LIST"))


def mark_step() -> None:
    record("mark_step")
