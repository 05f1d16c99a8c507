"""Graph capture and compilation of the training model.

HPU graphs record the lazy-mode graph of a module once and replay it, removing host overhead.
The bridge exports ModuleCacher in lazy mode only (habana_frameworks/torch/hpu/__init__.py:
``if is_lazy(): from .graphs import *``), and it refuses a DistributedDataParallel (whose
``forward(*inputs)`` it cannot cache), so it wraps the model itself, in place, before any DDP
wrapper, as optimum-habana's trainer does (``_wrap_model``). With --torch_compile on HPU (eager
mode) the compiled graph takes that role. The CUDA counterpart is CUDA graphs, which
torch.compile(mode="reduce-overhead") captures for static input shapes; compilation wraps the
DDP module, as torch recommends. CPU has neither.
"""
from __future__ import annotations

import importlib
import warnings
from typing import Any

import torch

from .device import DeviceInfo

_warned: set = set()


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def apply_hpu_graphs(model: torch.nn.Module, info: DeviceInfo, args: Any) -> bool:
    """Wrap ``model`` (not a DDP wrapper of it) with HPU graphs, in place; whether it was."""
    if not getattr(args, "use_hpu_graphs_for_training", False) or info.kind != "hpu":
        return False
    if not info.lazy:
        what = "the compiled graph runs instead" if getattr(args, "torch_compile", False) else "not used"
        _warn_once("hpu-eager", f"use_hpu_graphs_for_training needs HPU lazy mode (PT_HPU_LAZY_MODE=1): {what}")
        return False
    hpu = importlib.import_module("habana_frameworks.torch.hpu")
    hpu.ModuleCacher()(model=model, inplace=True)
    return True


def compile_model(model: Any, info: DeviceInfo, args: Any) -> Any:
    """torch.compile (and CUDA graphs for --use_hpu_graphs_for_training on CUDA), around DDP if any."""
    use_graphs = getattr(args, "use_hpu_graphs_for_training", False)
    if use_graphs and info.kind == "cuda":
        # CUDA graphs via torch.compile; it already compiles, so torch_compile adds nothing.
        return torch.compile(model, mode="reduce-overhead")
    if use_graphs and info.kind == "cpu":
        _warn_once("cpu", "use_hpu_graphs_for_training: HPU graphs do not apply on CPU; model left as is")
    if getattr(args, "torch_compile", False):
        return torch.compile(model, backend="hpu_backend" if info.kind == "hpu" else "inductor")
    return model
