"""Stand-in for habana_frameworks.torch.hpu.streams (exported by hpu in every mode).

As python_packages/habana_frameworks/torch/hpu/streams.py (bridge 1.19): ``Stream()`` makes a stream,
``stream(s)`` is a context manager that makes it the current one and restores the previous one on
exit (a no-op for None). One device per process; the stand-in keeps only which stream is current,
which HPU graph capture checks (hpugraph.py).
"""

from __future__ import annotations

import itertools
from typing import Optional

_ids = itertools.count(1)


class Stream:
    def __init__(self, device=None, priority: int = 0) -> None:
        self.stream_id = next(_ids)

    def synchronize(self) -> None:
        pass

    def __repr__(self) -> str:
        return f"<stand-in hpu Stream {self.stream_id}>"


_default = Stream()
_current: Stream = _default


def current_stream(device=None) -> Stream:
    return _current


def default_stream(device=None) -> Stream:
    return _default


class StreamContext:
    def __init__(self, stream: Optional[Stream]) -> None:
        self.stream, self.prev = stream, None

    def __enter__(self):
        global _current
        if self.stream is not None:
            self.prev, _current = _current, self.stream

    def __exit__(self, *exc) -> None:
        global _current
        if self.stream is not None:
            _current = self.prev


def stream(stream: Optional[Stream]) -> StreamContext:
    return StreamContext(stream)
