"""Graph capture and compilation of the training model.

HPU graphs record the lazy-mode graph of a module once and replay it, removing host overhead;
ModuleCacher needs lazy mode or torch.compile to have a graph to record. The CUDA counterpart is
CUDA graphs, which torch.compile(mode="reduce-overhead") captures for static input shapes (a new
shape means a recompile). CPU has neither.
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


def wrap_for_graphs(model: torch.nn.Module, info: DeviceInfo, args: Any) -> Any:
    use_graphs = getattr(args, "use_hpu_graphs_for_training", False)
    compile_ = getattr(args, "torch_compile", False)
    if use_graphs:
        if info.kind == "hpu":
            if info.lazy or compile_:
                hpu = importlib.import_module("habana_frameworks.torch.hpu")
                wrapped = hpu.ModuleCacher()(model=model, inplace=True)
                model = wrapped if wrapped is not None else model
            else:
                _warn_once("hpu-eager", "use_hpu_graphs_for_training needs lazy mode or torch_compile: "
                                        "HPU graphs not used")
        elif info.kind == "cuda":
            # CUDA graphs via torch.compile; it already compiles, so torch_compile adds nothing.
            return torch.compile(model, mode="reduce-overhead")
        else:
            _warn_once("cpu", "use_hpu_graphs_for_training: HPU graphs do not apply on CPU; model left as is")
    if compile_:
        model = torch.compile(model, backend="hpu_backend" if info.kind == "hpu" else "inductor")
    return model
