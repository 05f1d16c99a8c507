"""Stand-in for habana_frameworks.torch.core: records the env it was imported under, and mark_step.

As python_packages/habana_frameworks/torch/core/__init__.py and core/step_closure.py (bridge
1.19): ``mark_step`` is ``lazy_only`` (a no-op in eager mode, so it is recorded only in lazy
mode), ``_mark_step_if_lazy`` is what the fused optimizers call, and importing the module
registers habana_frameworks.torch.hpu as ``torch.hpu``.
"""

from __future__ import annotations

import os

import torch
from habana_frameworks import record
from habana_frameworks.torch import hpu
from habana_frameworks.torch.utils.internal import is_lazy, lazy_only

_LISTS = ("PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST", "PT_HPU_AUTOCAST_FP32_OPS_LIST")


def _read(path):
    try:
        with open(path) as f:
            return f.read()
    except (OSError, TypeError):
        return None


# The 1.19 bridge's RecipeCacheConfig::reload (pytorch_helpers/habana_helpers/habana_serialization/
# recipe_cache_config.cpp) asserts 1 to 3 comma-separated fields; the fourth (<RECIPE_CACHE_ON_NFS>) came later.
_recipe_cache = os.environ.get("PT_HPU_RECIPE_CACHE_CONFIG")
if _recipe_cache is not None and not 1 <= len(_recipe_cache.split(",")) <= 3:
    raise RuntimeError(
        "Expected number of parameters extracted from PT_HPU_RECIPE_CACHE_CONFIG should be from range <1:3>."
    )

# The real bridge reads these once, at import: the tests assert they were set (and the op-list
# files written) before it.
record(
    "core.import",
    PT_HPU_LAZY_MODE=os.environ.get("PT_HPU_LAZY_MODE"),
    PT_ENABLE_INT64_SUPPORT=os.environ.get("PT_ENABLE_INT64_SUPPORT"),  # env_flags.yaml; read once, cached
    PT_HPU_RECIPE_CACHE_CONFIG=_recipe_cache,
    **{var: os.environ.get(var) for var in _LISTS},
    op_lists={var: _read(os.environ.get(var)) for var in _LISTS},
)

torch._register_device_module("hpu", hpu)


@lazy_only
def mark_step(device_str: str = "", sync: bool = False) -> None:
    record("mark_step")


class step_closure:  # the real one is a module; the optimizers reach it as htcore.step_closure
    @staticmethod
    def _mark_step_if_lazy(device_str: str = "") -> None:
        if is_lazy():
            mark_step(device_str)
