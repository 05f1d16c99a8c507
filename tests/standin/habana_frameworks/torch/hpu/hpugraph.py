"""Stand-in for the bridge's ``HPUGraph`` (habana_frameworks/torch/hpu/graphs.py; lazy mode only).

As bridge 1.19: graphs.py's ``HPUGraph`` wraps the C++ one (backend/habana_device/HPUGraph.cpp) and
hpu/__init__.py exports it only in lazy mode (``if is_lazy(): from .graphs import *``), which is why
optimum-habana captures fast_ddp's gradient packing in lazy mode only. Its rules, kept here:

- ``capture_begin()`` flushes the pending lazy ops (a step marker), then records the device work
  queued on the current stream until ``capture_end()``, which must come on the same stream; a second
  capture while one is in progress is fatal ("graph Capture already in progress"). The captured work
  runs during the capture (wrap_in_hpu_graph returns the capture's outputs without a replay).
- ``replay()`` flushes the pending lazy ops (a step marker of its own), then runs the captured work
  again on the SAME tensors it was captured with: a tensor replaced since (a gradient set to None and
  made anew) is not read, the old one is. A replay during a capture is fatal ("Capture in progress").

The stand-in records the HPU ops run during the capture (those on hpu tensors; host work is not
captured) and re-runs them on replay, writing each op's results into the tensors the capture
returned. Collectives are not captured (optimum-habana issues the all-reduce between two graphs).
Records "HPUGraph.capture_begin", "HPUGraph.capture_end" and "HPUGraph.replay" with the op count.
"""

from __future__ import annotations

from typing import Any, Optional

import hpu_stand_in_device as _bridge
import torch
from habana_frameworks import record
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from . import streams

_capturing: Optional[HPUGraph] = None


def _touches_hpu(*trees) -> bool:
    return any(_bridge.is_hpu_tensor(x) for tree in trees for x in tree_flatten(tree)[0])


class _Capture(TorchDispatchMode):
    def __init__(self, ops: list) -> None:
        super().__init__()
        self.ops = ops

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.namespace == "c10d":
            raise NotImplementedError(
                f"HPU graph stand-in: a collective ({func.name()}) inside a capture is not modelled; "
                "issue it between graphs, as optimum-habana's fast_ddp does"
            )
        out = func(*args, **kwargs)
        if _touches_hpu(args, kwargs, out):
            self.ops.append((func, args, kwargs, out))
        return out


class HPUGraph:
    def __init__(self) -> None:
        self.ops: list[tuple[Any, tuple, dict, Any]] = []
        self._mode: Optional[_Capture] = None
        self._stream: Optional[streams.Stream] = None

    def capture_begin(self, dry_run: bool = False) -> None:
        global _capturing
        if _capturing is not None:
            raise RuntimeError("GRAPH:: graph Capture already in progress")
        record("HPUGraph.capture_begin")
        _capturing, self._stream, self.ops = self, streams.current_stream(), []
        self._mode = _Capture(self.ops)
        self._mode.__enter__()

    def capture_end(self) -> None:
        global _capturing
        if _capturing is not self:
            return  # the bridge: nothing to end (a debug message)
        if streams.current_stream() is not self._stream:
            raise RuntimeError("GRAPH:: Capture must end on the same stream it began on.")
        self._mode.__exit__(None, None, None)
        _capturing, self._mode = None, None
        record("HPUGraph.capture_end", ops=len(self.ops))

    def replay(self, asynchronous: bool = False) -> None:
        if _capturing is not None:
            raise RuntimeError("GRAPH:: Capture in progress")
        record("HPUGraph.replay", ops=len(self.ops))
        with torch.no_grad():
            for func, args, kwargs, out in self.ops:
                fresh = func(*args, **kwargs)
                for dst, src in zip(tree_flatten(out)[0], tree_flatten(fresh)[0]):
                    if _bridge.is_hpu_tensor(dst) and _bridge.is_hpu_tensor(src) and src is not dst:
                        if src.elem.data_ptr() != dst.elem.data_ptr() or src.elem.stride() != dst.elem.stride():
                            dst.elem.copy_(src.elem)  # the captured output tensor holds the new values
