"""One fused gradient all-reduce per optimizer step: optimum-habana's ``fast_ddp``, written anew.

torch's DistributedDataParallel hooks autograd and reduces gradients in buckets while backward is
still running. On Gaudi those many small collectives (and DDP's hooks breaking lazy-mode graphs)
cost more than they overlap, so optimum-habana skips the DDP wrap: parameters are broadcast from
rank 0 once, and after backward every gradient is packed into one flat buffer that is reduced
with a single ``all_reduce``. The same code runs on hccl, nccl and gloo, which is what lets the
CPU tests check it against DDP for real.
"""

from __future__ import annotations

import importlib
import weakref
from typing import Callable, Optional

import torch
import torch.distributed as dist


class FastDDP:
    """One fused gradient all-reduce per step (optimum-habana's fast_ddp), for hccl, nccl and gloo.

    Call :meth:`broadcast_parameters` once before training and :meth:`all_reduce_gradients`
    after each backward (before the optimizer step); afterwards every rank holds the gradient of
    the mean loss over all ranks' batches, like DDP.

    ``buffer_dtype`` is the fusion buffer's dtype (default float32; the Trainer passes bfloat16
    on HPU like upstream, halving the bytes on the wire at the cost of bf16 rounding).
    ``wait`` waits on the collective's work handle before copying the result back; only HPU's
    lazy mode orders the copy after the collective by itself, everywhere else it is required.
    ``grads_as_views`` makes the gradients views of the buffer when it has their dtype, so nothing
    is copied per step (default: off HPU, which keeps optimum-habana's copies).
    ``hpu_graphs`` captures those copies (scaling into the buffer, and back) as two HPU graphs on the
    first step and replays them after, as optimum-habana's fast_ddp does: the host then queues two
    replays a step instead of a few ops per parameter, and no mark_step is needed around them (each
    replay flushes the pending lazy ops first). Default: wherever the bridge offers HPUGraph, which
    it does in lazy mode only.

    The instance holds the model weakly, so caching one per model never keeps a model alive.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        buffer_dtype: Optional[torch.dtype] = None,
        group=None,
        wait: bool = True,
        grads_as_views: Optional[bool] = None,
        hpu_graphs: Optional[bool] = None,
    ) -> None:
        self._model_ref = weakref.ref(model)
        self.buffer_dtype = buffer_dtype if buffer_dtype is not None else torch.float32
        self.group = group
        self.wait = wait
        self.grads_as_views = grads_as_views  # None: off HPU (the gradients' device) only
        self.hpu_graphs = hpu_graphs  # None: where the bridge has HPUGraph (HPU lazy mode)
        # Built on the first all-reduce, then reused: the buffer and one view per parameter.
        self._buffer: Optional[torch.Tensor] = None
        self._entries: Optional[list[tuple[str, torch.nn.Parameter, torch.Tensor]]] = None
        self._bound = False  # the gradients are views of the buffer
        self._covers_all = False  # every trainable parameter has its place in the buffer
        # The captured pack/unpack graphs and the gradient tensors they read and write: a graph
        # replays on the tensors it was captured with, so a replaced gradient means a new capture.
        self._graphs: dict[str, object] = {}
        self._graph_grads: tuple = ()

    @property
    def model(self) -> torch.nn.Module:
        model = self._model_ref()
        if model is None:
            raise RuntimeError("FastDDP: the model it was built for no longer exists")
        return model

    def world_size(self) -> int:
        """Ranks in the group; 1 when torch.distributed is not initialised (nothing to reduce)."""
        if not (dist.is_available() and dist.is_initialized()):
            return 1
        return dist.get_world_size(self.group)

    def broadcast_parameters(self, src: int = 0) -> None:
        """Copy rank ``src``'s parameters and buffers to every rank (DDP does this when wrapping).

        ``src`` is a global rank, as in ``torch.distributed.broadcast``.
        """
        if self.world_size() == 1:
            return
        model = self.model
        with torch.no_grad():
            # In the model's own order, so every rank issues the same sequence of collectives.
            for tensor in list(model.parameters()) + list(model.buffers()):
                dist.broadcast(tensor.data, src=src, group=self.group)

    def _build(self) -> None:
        """Lay out one flat buffer for every gradient present now, in parameters() order."""
        params = [(name, p) for name, p in self.model.named_parameters() if p.requires_grad and p.grad is not None]
        if not params:
            raise RuntimeError("FastDDP.all_reduce_gradients: no parameter has a gradient; call it after backward()")
        for name, p in params:
            if p.grad.is_sparse:
                raise RuntimeError(f"FastDDP: sparse gradient for {name!r} is not supported")
        device = params[0][1].grad.device
        total = sum(p.grad.numel() for _, p in params)
        # No bucketing: a single collective is the whole point on Gaudi.
        self._buffer = torch.empty(total, dtype=self.buffer_dtype, device=device)
        entries = []
        offset = 0
        for name, p in params:
            n = p.grad.numel()
            entries.append((name, p, self._buffer[offset : offset + n]))
            offset += n
        self._entries = entries
        # Off HPU, with a buffer of the gradients' own dtype, the gradients become views of the
        # buffer (DDP's gradient_as_bucket_view): backward accumulates into it in place, so a step
        # copies nothing in or out, and the buffer is every gradient at once (clip_grad_norm_).
        # HPU keeps optimum-habana's copies (its buffer is bf16 by default).
        views = self.grads_as_views if self.grads_as_views is not None else device.type != "hpu"
        self._bound = views and all(
            p.grad.dtype == self.buffer_dtype and p.grad.is_contiguous() and p.grad.shape == p.shape for _, p in params
        )
        if self._bound:
            with torch.no_grad():
                for _, p, view in entries:
                    view.copy_(p.grad.reshape(-1))
                    p.grad = view.view(p.shape)
        trainable = sum(1 for p in self.model.parameters() if p.requires_grad)
        self._covers_all = len(entries) == trainable

    def all_reduce_gradients(self) -> None:
        """Average every cached parameter's gradient over the ranks with one ``all_reduce``."""
        world = self.world_size()
        if world == 1:
            return
        if self._entries is None:
            self._build()
        assert self._entries is not None and self._buffer is not None
        scale = 1.0 / world
        # Pre-scaling by 1/world (instead of dividing afterwards) keeps bf16 sums in range and
        # matches upstream's numerics. Every check happens before the collective, so a rank that
        # raises here raises on all ranks alike instead of leaving the others hanging in all_reduce.
        for name, p, view in self._entries:
            grad = p.grad
            if grad is None:
                raise RuntimeError(
                    f"FastDDP: parameter {name!r} had a gradient at the first all-reduce but its "
                    "grad is None now. The fused buffer's layout is fixed at the first step; keep "
                    "grad tensors alive with optimizer.zero_grad(set_to_none=False) (or "
                    "model.zero_grad(set_to_none=False)), and make sure every step uses this parameter."
                )
            if self._bound and grad.data_ptr() != view.data_ptr():
                # Replaced since (set_to_none, or assigned): back into the buffer, a view again.
                with torch.no_grad():
                    view.copy_(grad.reshape(-1))
                p.grad = view.view(p.shape)
        if self._bound:
            with torch.no_grad():
                self._buffer.mul_(scale)  # the same products as scaling each gradient
        else:
            self._copies("pack", lambda: self._pack(scale))
        work = dist.all_reduce(self._buffer, group=self.group, async_op=True)
        if self.wait:
            work.wait()
        if self._bound:
            return  # the gradients are the buffer
        self._copies("unpack", self._unpack)

    def _pack(self, scale: float) -> None:
        assert self._entries is not None
        for _, p, view in self._entries:
            flat = p.grad.detach().reshape(-1)
            if flat.dtype == view.dtype:
                torch.mul(flat, scale, out=view)
            else:
                # Scale in the gradient's precision, then round once into the buffer.
                view.copy_(flat * scale)

    def _unpack(self) -> None:
        assert self._entries is not None
        for _, p, view in self._entries:
            # copy_ casts back to the gradient's dtype and handles any gradient strides.
            p.grad.detach().copy_(view.view(p.grad.shape))

    def _copies(self, name: str, run: Callable[[], None]) -> None:
        """Run the pack or unpack copies: as an HPU graph where there is one, else op by op."""
        hpu = self._graph_api()
        if hpu is None:
            run()
            return
        assert self._entries is not None
        grads = tuple(p.grad for _, p, _ in self._entries)
        if len(grads) != len(self._graph_grads) or any(a is not b for a, b in zip(grads, self._graph_grads)):
            self._graphs.clear()  # gradient tensors replaced since the capture: capture anew
            self._graph_grads = grads
        graph = self._graphs.get(name)
        if graph is None:
            graph = hpu.HPUGraph()
            with hpu.stream(hpu.Stream()):
                graph.capture_begin()
                run()
                graph.capture_end()
            self._graphs[name] = graph
        graph.replay()  # as optimum-habana, also right after the capture

    def _graph_api(self):
        """habana_frameworks.torch.hpu when the copies are to be captured, else None."""
        if self.hpu_graphs is False or self._buffer is None or self._buffer.device.type != "hpu":
            return None
        hpu = importlib.import_module("habana_frameworks.torch.hpu")
        if hasattr(hpu, "HPUGraph"):
            return hpu
        if self.hpu_graphs:
            raise RuntimeError(
                "FastDDP(hpu_graphs=True): the Gaudi bridge offers HPU graphs in lazy mode only "
                "(PT_HPU_LAZY_MODE=1); pass hpu_graphs=None or False in eager mode"
            )
        return None

    def flat_gradients(self) -> Optional[torch.Tensor]:
        """Every gradient of the model as one tensor (the buffer, whose views they are), or None
        when they are not (HPU, another buffer dtype, before the first all-reduce, a trainable
        parameter that had no gradient then). Valid after :meth:`all_reduce_gradients`."""
        if not (self._bound and self._covers_all):
            return None
        return self._buffer


# Keyed weakly so a discarded model (and the FastDDP built for it) can be garbage collected.
_INSTANCES: weakref.WeakKeyDictionary[torch.nn.Module, FastDDP] = weakref.WeakKeyDictionary()


def all_reduce_gradients(
    model: torch.nn.Module,
    fusion_buffer_dtype: torch.dtype = torch.bfloat16,
    use_hpu_graphs: bool = True,
) -> None:
    """optimum-habana-compatible ``fast_ddp.all_reduce_gradients``: one FastDDP kept per model.

    ``use_hpu_graphs`` (optimum-habana's default, True) captures the copy-in/copy-out as HPU graphs
    where the bridge has them (HPU lazy mode); elsewhere it means nothing. The work handle is always
    waited on: on hccl and nccl that only orders the device streams (the host does not block), and
    on gloo it is what makes the result valid at all.
    """
    ddp = _INSTANCES.get(model)
    graphs = None if use_hpu_graphs else False
    if ddp is None or ddp.buffer_dtype != fusion_buffer_dtype or ddp.hpu_graphs != graphs:
        ddp = FastDDP(model, buffer_dtype=fusion_buffer_dtype, wait=True, hpu_graphs=graphs)
        _INSTANCES[model] = ddp
    ddp.all_reduce_gradients()
