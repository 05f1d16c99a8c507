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
        if getattr(args, "cache_size_limit", None):
            torch._dynamo.config.cache_size_limit = args.cache_size_limit
        for name in ("inline_inbuilt_nn_modules", "allow_unspec_int_on_nn_module"):
            # optimum-habana sets these dynamo switches from its flags of the same names (None: torch's own).
            if getattr(args, name, None) is not None:
                setattr(torch._dynamo.config, name, getattr(args, name))
        return torch.compile(
            model, backend=compile_backend(args, info.kind), dynamic=getattr(args, "compile_dynamic", None)
        )
    return model


def compile_backend(args: Any, kind: str) -> str:
    """--torch_compile_backend, else hpu_backend on HPU (Habana's only torch.compile backend: "PyTorch Support
    Matrix" page) and inductor elsewhere, as transformers and optimum-habana default it. Pure."""
    chosen = getattr(args, "torch_compile_backend", None)
    return chosen or ("hpu_backend" if kind == "hpu" else "inductor")


def mark_batch_dynamic(batch: Any, info: DeviceInfo, args: Any) -> None:
    """With --torch_compile off HPU, the batch dimension of every input tensor is dynamic from the
    first step: a short last batch (dataloader_drop_last false) or an evaluation batch of another
    size then runs the graph compiled at the first step. Left static, the first new size recompiles
    the forward and backward in the middle of training (5-20 s each here, for a tiny GPT-2 or T5,
    every time a new size comes), and the steps that wait for it count in the throughput.
    ``maybe_mark_dynamic`` never fails: a model that needs a fixed batch size gets it specialised.
    HPU keeps static shapes, as optimum-habana does (its trainer and accelerate wrapper mark no
    dimension dynamic; Gaudi's graph compiler wants fixed shapes), and so does --compile_dynamic false."""
    if not getattr(args, "torch_compile", False) or info.kind == "hpu":
        return
    if getattr(args, "compile_dynamic", None) is False:
        return
    for value in batch.values():
        if torch.is_tensor(value) and value.dim() > 0:
            torch._dynamo.maybe_mark_dynamic(value, 0)


class InferenceGraphs:
    """HPU graphs for evaluation outside training (--use_hpu_graphs_for_inference), as optimum-habana
    uses them: wrap_in_hpu_graph replaces the model's forward in place, and its replay keeps no
    autograd graph, so training takes the forward back first."""

    def __init__(self, model: torch.nn.Module, info: DeviceInfo, args: Any) -> None:
        self.model, self.info, self.args = model, info, args
        self.wrapped = False
        self._before: Any = None

    def on(self) -> None:
        if self.wrapped or self.info.kind != "hpu" or not self.info.lazy:
            return
        if not (getattr(self.args, "use_hpu_graphs_for_inference", False)):
            return
        self._before = self.model.__dict__.get("forward")  # an instance forward (HPU graphs for training)
        hpu = importlib.import_module("habana_frameworks.torch.hpu")
        hpu.wrap_in_hpu_graph(
            self.model,
            disable_tensor_cache=self.args.disable_tensor_cache_hpu_graphs,
            max_graphs=self.args.max_hpu_graphs,
        )
        self.wrapped = True

    def off(self) -> None:
        if not self.wrapped:
            return
        if self._before is None:
            del self.model.forward  # back to the class's own
        else:
            self.model.forward = self._before
        self.wrapped = False
