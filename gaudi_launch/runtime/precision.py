"""bfloat16 autocast on whichever device the run is on."""
from __future__ import annotations

import contextlib
from typing import Any, ContextManager, Optional

import torch

from .device import DeviceInfo


def autocast(info: DeviceInfo, args: Any, gaudi_config: Optional[Any] = None) -> ContextManager:
    """The context the forward pass runs in: bf16 autocast when args.bf16, else nothing.

    On HPU the op lists from the gaudi config are already in the environment (prepare_hpu_env);
    torch.autocast("hpu") reads them. ``half_precision_backend="cpu_amp"`` asks for CPU autocast,
    as in optimum-habana.
    """
    if not getattr(args, "bf16", False):
        return contextlib.nullcontext()
    backend = getattr(args, "half_precision_backend", "auto")
    if backend == "cpu_amp" or info.kind == "cpu":
        return torch.autocast("cpu", dtype=torch.bfloat16)
    # info.device.type rather than info.kind: "hpu" on Gaudi, the test stand-in's CPU tensors otherwise.
    return torch.autocast(info.device.type, dtype=torch.bfloat16)
