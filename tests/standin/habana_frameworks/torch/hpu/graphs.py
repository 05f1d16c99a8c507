"""Stand-in for habana_frameworks.torch.hpu.graphs (HPU graphs; lazy mode only).

As python_packages/habana_frameworks/torch/hpu/graphs.py (bridge 1.19): ``ModuleCacher()(model=...)``
reads the forward's signature and asserts on ``*args`` (``Unsupported argument type``), so a
DistributedDataParallel (``forward(*inputs, **kwargs)``) cannot be wrapped: optimum-habana wraps
the model first and DDP after. With ``inplace=True`` it replaces ``model.forward`` and returns the
model itself. The stand-in records the wrap and each training forward it would have cached.
"""

from __future__ import annotations

import inspect

import torch
from habana_frameworks import record

_UNSUPPORTED = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.VAR_POSITIONAL)


def _check_signature(forward) -> None:
    for name, p in inspect.signature(forward).parameters.items():
        assert p.kind not in _UNSUPPORTED, f"Unsupported argument type : {p.kind}"


class ModuleCacher(torch.nn.Module):
    def __init__(self, max_graphs: int = 10) -> None:
        super().__init__()
        self.max_graphs = max_graphs

    def __call__(
        self,
        model,
        use_lfu=False,
        inplace=True,
        allow_unused_input=False,
        asynchronous=False,
        have_grad_accumulation=False,
        log_frequency=100,
        verbose=False,
        disable_tensor_cache=False,
        dry_run=False,
    ):
        assert not isinstance(model, (torch.nn.DataParallel, torch.nn.parallel.DistributedDataParallel)), (
            "Use DataParallel/DistributedDataParallel only after wrapping with ModuleCacher"
        )
        _check_signature(model.forward)
        record("ModuleCacher", model=type(model).__name__, inplace=inplace)
        orig = model.forward

        def forward(*args, **kwargs):
            if model.training and torch.is_grad_enabled():
                record("ModuleCacher.replay")
            return orig(*args, **kwargs)

        model.orig_forward = orig
        model.forward = forward
        return model


def wrap_in_hpu_graph(module, asynchronous=False, disable_tensor_cache=False, dry_run=False, max_graphs=None):
    """As the bridge's: replaces ``module.forward`` in place and returns the module. A replayed
    graph carries no autograd history, so the stand-in runs the forward without one: training
    through it fails at backward, as it would on a Gaudi."""
    record(
        "wrap_in_hpu_graph",
        model=type(module).__name__,
        disable_tensor_cache=disable_tensor_cache,
        max_graphs=max_graphs,
    )
    orig = module.forward

    def forward(*args, **kwargs):
        record("wrap_in_hpu_graph.replay")
        with torch.no_grad():
            return orig(*args, **kwargs)

    module.forward = forward
    return module
