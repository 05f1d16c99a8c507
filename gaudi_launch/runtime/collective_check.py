"""One card's process of a collective check job: a pair of hosts, or the confirm of every host left.

Started by the host's agent (runtime/link_check.py), one process per card the job will use, with the job's
environment (its HCCL_* and scale-out variables, visible modules) and the device's library (select_device:
hccl on Gaudi, nccl on CUDA, gloo on CPU). It does what Habana's health screen runs on each pair of nodes,
hccl_demo's all_reduce (HabanaAI/Setup_and_Install r1.22.0, utils/intel_gaudi_health_screen/template/
bare-metal/run_hccl_demo.sh: --test all_reduce --size 32m --loop 1000): one warm-up, then LOOPS
all-reduces of BYTES timed together, and prints one marker record with the mean time of one. Nothing here
bounds a wait: the bridge's HCCL waits never time out (WorkHCCL::wait), so the agent kills this process's
group when the pair's deadline passes. Settings in GAUDI_LAUNCH_COLLECTIVE: {"bytes", "loops", "timeout"}.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time

import torch
import torch.distributed as dist

from gaudi_launch.runtime.device import init_distributed, select_device, synchronize
from gaudi_launch.wire import COLLECTIVE, COLLECTIVE_MARKER


def say(record: dict) -> None:
    print(COLLECTIVE_MARKER + json.dumps(record, sort_keys=True), flush=True)


def main() -> int:
    cfg = json.loads(os.environ.get(COLLECTIVE, "{}") or "{}")
    size, loops, timeout = int(cfg.get("bytes", 32 << 20)), int(cfg.get("loops", 1000)), float(cfg.get("timeout", 130))
    host = socket.gethostname()
    rank = int(os.environ.get("RANK", "0"))
    step = "init"
    try:
        info = select_device()
        rank, world = init_distributed(info, timeout_s=timeout)
        n = max(1, size // 4)
        buf = torch.ones(n, dtype=torch.float32, device=info.device)
        step = "allreduce"
        dist.all_reduce(buf)  # the warm-up sets up the connections
        synchronize(info)
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(loops):
            dist.all_reduce(buf)
        synchronize(info)
        took = (time.perf_counter() - t0) / max(1, loops)
        say(
            {
                "step": step,
                "rank": rank,
                "host": host,
                "seconds": took,
                "bytes": n * 4,
                "ranks": world,
                "backend": info.dist_backend,
            }
        )
    except Exception as exc:
        say({"step": step, "rank": rank, "host": host, "error": f"{type(exc).__name__}: {exc}"[:500]})
        sys.stdout.flush()
        os._exit(1)
    sys.stdout.flush()
    os._exit(0)  # not destroy_process_group: it can wait on a peer that failed


if __name__ == "__main__":
    sys.exit(main())
