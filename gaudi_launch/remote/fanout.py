"""One per-host fan-out for everything the launcher does on every host at once (pre-flight, the
job file for DeepSpeed, the end-of-job sweep, `gaudi-launch env --hostfile`, the host watch's probes,
`--wait-hosts`, `ssh -G` for the hosts that need it).

Each call is an ssh client (or a local process) that mostly waits, so the pool is as wide as the host
list, bounded by what this process may open: every ssh child holds a few descriptors (its three
pipes, a socket), and a pool wider than the open-file limit would fail hosts for no reason of theirs.
Results come back keyed by host, in the order of the hosts given (a host named twice runs once).
"""

from __future__ import annotations

import resource
from collections.abc import Sequence
from typing import Callable, Optional, TypeVar

R = TypeVar("R")

MAX_WORKERS = 512
FDS_PER_CALL = 8  # an ssh child's pipes (3 x 2 ends while it starts) and its socket, with room


def pool_size(hosts: int, fd_limit: Optional[int] = None) -> int:
    """Threads for ``hosts`` calls at once: one per host, within the open-file limit. Pure given it."""
    if fd_limit is None:
        try:
            fd_limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        except (OSError, ValueError):
            fd_limit = 1024
        if fd_limit == resource.RLIM_INFINITY:
            fd_limit = 1 << 20
    room = max(4, (fd_limit - 64) // FDS_PER_CALL)  # 64: what the launcher holds itself
    return max(1, min(hosts, room, MAX_WORKERS))


def per_host(
    hosts: Sequence[str],
    fn: Callable[[str], R],
    *,
    timeout: Optional[float] = None,
    default: Optional[Callable[[str], R]] = None,
    on_done: Optional[Callable[[str, R], None]] = None,
    workers: Optional[int] = None,
    name: str = "per-host",
) -> dict[str, R]:
    """``fn(host)`` for every distinct host, all at once (see pool_size); {host: result} in the order
    of ``hosts``. ``on_done(host, result)`` is called as each finishes (in this thread). A host still
    running after ``timeout`` seconds gets ``default(host)`` (``fn`` should bound its own time; this
    is the backstop) and its thread is left to finish. An exception from ``fn`` is raised here after
    the others have finished."""
    import concurrent.futures  # here: the rank bootstrap imports this module (teardown), never a pool

    unique = list(dict.fromkeys(hosts))
    if not unique:
        return {}
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=workers or pool_size(len(unique)), thread_name_prefix=name)
    results: dict[str, R] = {}
    error: Optional[BaseException] = None
    try:
        futures = {pool.submit(fn, h): h for h in unique}
        try:
            for fut in concurrent.futures.as_completed(futures, timeout=timeout):
                host = futures[fut]
                try:
                    results[host] = fut.result()
                except Exception as exc:  # noqa: BLE001 - raised below, once every host is done
                    error = error or exc
                    continue
                if on_done is not None:
                    on_done(host, results[host])
        except concurrent.futures.TimeoutError:
            if default is None:
                raise
            for host in unique:
                if host not in results:
                    results[host] = default(host)
    finally:
        pool.shutdown(wait=error is None and len(results) == len(unique), cancel_futures=True)
    if error is not None:
        raise error
    return {h: results[h] for h in unique if h in results}
