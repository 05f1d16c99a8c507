"""bfloat16 autocast on whichever device the run is on."""

from __future__ import annotations

import contextlib
from typing import Any, Optional

import torch

from .device import DeviceInfo
from .hpu_env import autocast_enabled


def autocast(info: DeviceInfo, args: Any, gaudi_config: Optional[Any] = None) -> contextlib.AbstractContextManager:
    """The context the forward pass runs in: bf16 autocast, or nothing.

    On HPU it is on as optimum-habana turns it on: --bf16 or the gaudi config's
    use_torch_autocast, not under DeepSpeed; the op lists from the gaudi config are already in the
    environment (prepare_hpu_env) and torch.autocast("hpu") follows them.
    ``half_precision_backend="cpu_amp"`` asks for CPU autocast, as in optimum-habana. Elsewhere
    --bf16 alone decides.
    """
    if info.kind == "hpu":
        if not autocast_enabled(args, gaudi_config):
            return contextlib.nullcontext()
        device_type = "cpu" if getattr(args, "half_precision_backend", "hpu_amp") == "cpu_amp" else "hpu"
        return torch.autocast(device_type, dtype=torch.bfloat16)
    if not getattr(args, "bf16", False):
        return contextlib.nullcontext()
    if info.kind == "cuda" and getattr(args, "half_precision_backend", "auto") != "cpu_amp":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return torch.autocast("cpu", dtype=torch.bfloat16)
