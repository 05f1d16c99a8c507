"""Stand-in for habana_frameworks.torch.hpu.graphs (HPU graphs; lazy mode only).

As python_packages/habana_frameworks/torch/hpu/graphs.py (bridge 1.19): ``ModuleCacher()(model=...)``
reads the forward's signature and asserts on ``*args`` (``Unsupported argument type``), so a
DistributedDataParallel (``forward(*inputs, **kwargs)``) cannot be wrapped: optimum-habana wraps
the model first and DDP after. With ``inplace=True`` it replaces ``model.forward`` and returns the
model itself. The stand-in records the wrap, and each training forward as a capture (a new input
signature) or a replay.
``wrap_in_hpu_graph`` (inference) captures per input shape and returns static outputs, as the bridge.
"""

from __future__ import annotations

import copy
import inspect

import hpu_stand_in_device as _bridge
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
        signature = inspect.signature(orig)
        graphs: dict = {}  # input key -> the host reads of its capture

        def forward(*args, **kwargs):
            # As ModuleCacher.forward: training forwards are cached by the hash of all the forward's
            # arguments, defaults included (GraphModel.full_input_hash); a new one is captured while
            # fewer than max_graphs are, the rest run uncached. A replay runs no Python: its host
            # reads are no syncs, and the values the capture read stay baked in (see wrap_in_hpu_graph).
            if not (model.training and torch.is_grad_enabled()):
                return orig(*args, **kwargs)
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            key = (_input_key(dict(bound.arguments)), torch.is_autocast_enabled("hpu"))
            if key not in graphs and len(graphs) >= self.max_graphs:
                record("ModuleCacher.uncached")
                return orig(*args, **kwargs)
            mode = "replay" if key in graphs else "capture"
            record(f"ModuleCacher.{mode}")
            _bridge.graph_mode, _bridge.graph_reads = mode, []
            try:
                out, reads = orig(*args, **kwargs), _bridge.graph_reads
            finally:
                _bridge.graph_mode, _bridge.graph_reads = None, None
            if mode == "capture":
                graphs[key] = reads
            elif not _same_reads(graphs[key], reads):
                record("ModuleCacher.stale_read", captured=graphs[key], now=reads)
            return out

        model.orig_forward = orig
        model.forward = forward
        return model


def _input_key(obj):
    """As the bridge's ``input_hash``: tensors by shape and view (the stand-in adds the dtype), other
    values by themselves, and whether hpu autocast is on."""
    if isinstance(obj, dict):
        return tuple((k, _input_key(v)) for k, v in obj.items())
    if isinstance(obj, (list, tuple)) and not isinstance(obj, torch.Size):
        return tuple(_input_key(v) for v in obj)
    if torch.is_tensor(obj):
        return (tuple(obj.shape), obj.stride(), obj.storage_offset(), obj.dtype)
    return obj


def _output_tensors(obj, out: list) -> list:
    """The tensors of a forward's output, in a fixed order (a ModelOutput is a dict)."""
    if torch.is_tensor(obj):
        out.append(obj)
    elif isinstance(obj, dict):
        for v in obj.values():
            _output_tensors(v, out)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            _output_tensors(v, out)
    return out


def _same_read(a, b) -> bool:
    if torch.is_tensor(a) and torch.is_tensor(b):
        return a.shape == b.shape and bool(torch.equal(a, b))
    return a == b


def _untouched(inputs):
    """The inputs with every object in them copied but the tensors given directly (the graph's inputs)."""
    return copy.deepcopy(inputs, {id(t): t for t in _output_tensors(inputs, [])})


def _same_reads(captured: list, now: list) -> bool:
    return len(captured) == len(now) and all(a[0] == b[0] and _same_read(a[1], b[1]) for a, b in zip(captured, now))


class _Graph:
    def __init__(self, outputs, reads: list) -> None:
        self.outputs, self.reads = outputs, reads


def _run_graph(mode: str, fn, args, kwargs):
    """The forward under no autograd, with the host reads it makes collected (see hpu_stand_in_device)."""
    _bridge.graph_mode, _bridge.graph_reads = mode, []
    try:
        with torch.no_grad():
            return fn(*args, **kwargs), _bridge.graph_reads
    finally:
        _bridge.graph_mode, _bridge.graph_reads = None, None


def wrap_in_hpu_graph(module, asynchronous=False, disable_tensor_cache=False, dry_run=False, max_graphs=None):
    """As the bridge's (graphs.py: wrap_in_hpu_graph, wrapped_hpugraph_forward): replaces
    ``module.forward`` in place and returns the module. Graphs are cached by the inputs' shapes
    (``input_hash``); a new shape captures one (returning the capture's outputs), at most
    ``max_graphs`` of them (beyond, the plain forward runs). A replay returns the SAME output objects
    every time (``cached.graph_outputs``), their tensors overwritten by each replay: a caller that
    keeps a tensor of one replay sees it change at the next. A replayed graph carries no autograd
    history, so the stand-in runs the forward without one: training through it fails at backward,
    as it would on a Gaudi. A replay whose inputs would make the forward read other values on the
    host than the capture did is recorded ("stale_read"): the real graph replays the captured branch."""
    record(
        "wrap_in_hpu_graph",
        model=type(module).__name__,
        disable_tensor_cache=disable_tensor_cache,
        max_graphs=max_graphs,
    )
    orig = module.forward
    cache: dict = {}

    def forward(*args, **kwargs):
        if kwargs.pop("bypass_hpu_graphs", False):
            return orig(*args, **kwargs)
        key = (_input_key((args, kwargs)), torch.is_autocast_enabled("hpu"))
        graph = cache.get(key)
        if graph is None:
            if max_graphs is not None and len(cache) == max_graphs:
                record("wrap_in_hpu_graph.uncached")
                with torch.no_grad():
                    return orig(*args, **kwargs)
            record("wrap_in_hpu_graph.capture")
            outputs, reads = _run_graph("capture", orig, args, kwargs)
            cache[key] = _Graph(outputs, reads)
            return outputs
        record("wrap_in_hpu_graph.replay")
        # A replay runs no Python: objects the forward would change in place (a generation cache that
        # grows by a step) stay as they are. The stand-in computes on copies of them (tensors shared).
        args, kwargs = _untouched((args, kwargs))
        fresh, reads = _run_graph("replay", orig, args, kwargs)
        if not _same_reads(graph.reads, reads):
            # The real replay takes the captured branch: wrong results where the value chose the
            # computation, harmless where it only chose, say, a warning. Recorded for tests to judge.
            record("wrap_in_hpu_graph.stale_read", captured=graph.reads, now=reads)
        static, new = _output_tensors(graph.outputs, []), _output_tensors(fresh, [])
        assert len(static) == len(new), "HPU graph replay: the outputs differ from the capture's"
        with torch.no_grad():
            for dst, src in zip(static, new):
                dst.copy_(src)
        return graph.outputs

    module.forward = forward
    module.clear_cache = cache.clear
    return module
