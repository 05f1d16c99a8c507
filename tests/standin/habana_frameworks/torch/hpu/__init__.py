"""Stand-in for habana_frameworks.torch.hpu.

As python_packages/habana_frameworks/torch/hpu/__init__.py (bridge 1.19): the HPU graph API
(``ModuleCacher``, ``wrap_in_hpu_graph``, ``HPUGraph``) is exported only in lazy mode (``if is_lazy():
from .graphs import *``), streams in every mode (``from .streams import *``); memory_stats reports
InUse/MaxInUse/Limit in bytes.
"""

from __future__ import annotations

import torch
from habana_frameworks import record
from habana_frameworks.torch.utils.internal import is_lazy

from .streams import Stream, StreamContext, current_stream, default_stream, stream  # noqa: F401

GB = 1024**3
# Plausible Gaudi2 figures, in bytes, as the real memory_stats() reports them.
MEMORY = {"InUse": int(1.234 * GB), "MaxInUse": int(2.5 * GB), "Limit": int(94.62 * GB)}

_rng = torch.Generator()


def is_available() -> bool:
    return True


def _lazy_init() -> None:
    pass


def device_count() -> int:
    return 1  # one device per process (HABANA_VISIBLE_MODULES)


def current_device() -> int:
    return 0


def is_bf16_supported() -> bool:
    return True


def get_amp_supported_dtype():
    return [torch.bfloat16, torch.float32]


def synchronize() -> None:
    record("synchronize")


def memory_stats(device=None) -> dict:
    record("memory_stats")
    return dict(MEMORY, NumAllocs=1, NumFrees=0)


def enable_dynamic_shape() -> None:
    record("enable_dynamic_shape")


def disable_dynamic_shape() -> None:
    record("disable_dynamic_shape")


def get_rng_state_all():
    return [_rng.get_state()]


def set_rng_state_all(states) -> None:
    _rng.set_state(states[0])


if is_lazy():
    from .graphs import ModuleCacher, wrap_in_hpu_graph  # noqa: F401
    from .hpugraph import HPUGraph  # noqa: F401  (the bridge's graphs.py; a module of its own here)
