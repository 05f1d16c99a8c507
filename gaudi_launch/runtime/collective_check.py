"""One rank of `gaudi-launch check --collective`: measures this host's part of the fabric.

Started by the launcher through the job's own backend, one rank per host, with the job's device and
communication library (select_device: hccl on Gaudi, nccl on CUDA, gloo on CPU). Steps, each bounded by
the process group's timeout (a peer that does not answer fails the step, it is not waited on):
  1. an all-reduce of SIZE bytes, ROUNDS times (after one warm-up);
  2. point-to-point on a ring and on its shifted ring: rank r sends to r+s and receives from r-s, so
     every host is measured with two partners and the launcher can tell a slow host from a slow peer.
Each step's result is one marker line on stdout (MARKER + JSON), which the launcher reads; nothing is
judged here. Settings come in GAUDI_LAUNCH_COLLECTIVE: "SIZE_BYTES,ROUNDS,STEP_TIMEOUT_S".
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist

from gaudi_launch.runtime.device import init_distributed, select_device, synchronize
from gaudi_launch.wire import COLLECTIVE, COLLECTIVE_MARKER

MARKER = COLLECTIVE_MARKER
SETTINGS = COLLECTIVE
LATENCY_ROUNDS = 10


def say(record: dict) -> None:
    print(MARKER + json.dumps(record, sort_keys=True), flush=True)


def shifts(world: int) -> list[int]:
    """The ring (1) and its shifted ring (2): two different partners per host from 3 hosts on."""
    return [1] if world <= 2 else [1, 2]


def _timed(info, fn) -> float:
    t0 = time.perf_counter()
    fn()
    synchronize(info)
    return time.perf_counter() - t0


def _exchange(info, send: torch.Tensor, recv: torch.Tensor, dst: int, src: int) -> float:
    """Seconds until this rank has received ``recv`` from ``src`` while sending ``send`` to ``dst``,
    both started at once after a barrier (the time of the link src -> this rank)."""
    dist.barrier()
    t0 = time.perf_counter()
    out = dist.isend(send, dst)
    inc = dist.irecv(recv, src)
    inc.wait()
    synchronize(info)
    took = time.perf_counter() - t0
    out.wait()
    return took


def main() -> int:
    size, rounds, timeout = os.environ.get(SETTINGS, "4194304,5,20").split(",")
    size, rounds, timeout = int(size), int(rounds), float(timeout)
    host = socket.gethostname()
    rank = int(os.environ.get("RANK", "0"))
    step = "init"
    try:
        info = select_device()
        say({"step": "start", "rank": rank, "host": host, "backend": info.dist_backend})
        rank, world = init_distributed(info, timeout_s=timeout)
        n = max(1, size // 4)
        buf = torch.ones(n, dtype=torch.float32, device=info.device)
        step = "allreduce"
        times = []
        for i in range(rounds + 1):
            dist.barrier()
            took = _timed(info, lambda: dist.all_reduce(buf))
            if i:  # the first round sets up the connections
                times.append(took)
        say({"step": step, "rank": rank, "host": host, "seconds": statistics.median(times), "bytes": n * 4})
        small_send = torch.zeros(2, dtype=torch.float32, device=info.device)
        small_recv = torch.zeros_like(small_send)
        recv = torch.empty_like(buf)
        for s in shifts(world):
            dst, src = (rank + s) % world, (rank - s) % world
            step = f"ring+{s}"
            lat = [_exchange(info, small_send, small_recv, dst, src) for _ in range(LATENCY_ROUNDS)]
            bw = [_exchange(info, buf, recv, dst, src) for _ in range(rounds + 1)][1:]
            say(
                {
                    "step": step,
                    "rank": rank,
                    "host": host,
                    "src": src,
                    # the best round: a slow link is slow every round, a busy CPU only in some
                    "seconds": min(bw),
                    "latency_s": statistics.median(lat),
                    "bytes": n * 4,
                }
            )
        step = "done"
        dist.barrier()
        say({"step": "done", "rank": rank, "host": host})
    except Exception as exc:  # the launcher names the step and the host; the others time out on their own
        say({"step": step, "rank": rank, "host": host, "error": f"{type(exc).__name__}: {exc}"[:500]})
        sys.stdout.flush()
        # The peers' timeouts fire within moments of ours: a little wait lets them report theirs before our
        # exit tears the job down, so that only the host that did not answer is silent.
        time.sleep(2)
        os._exit(1)  # not destroy_process_group: it can wait on the peer that failed us
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
