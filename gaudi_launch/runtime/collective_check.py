"""One card's process of the collective check's library stage: the pairs' all-reduce jobs, one after another.

Started by the host's agent (runtime/link_check.py), one process per card the job will use, with the job's
environment (its HCCL_* and scale-out variables, its card visibility, LOCAL_RANK = this card's place) and the
device's library (select_device: hccl on Gaudi, nccl on CUDA, gloo on CPU). torch is imported and the card
taken once, which it says ("ready"); each line on stdin is then one job: {"env": MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE; "bytes", "loops", "timeout"}.
A job does what Habana's health screen runs on each pair of nodes, hccl_demo's all_reduce
(HabanaAI/Setup_and_Install r1.22.0, utils/intel_gaudi_health_screen/template/bare-metal/run_hccl_demo.sh:
--test all_reduce --size 32m --loop 1000): one warm-up, then LOOPS all-reduces of BYTES timed together, and
prints one marker record with the mean time of one; then the process group goes and the next line is read.
Nothing here bounds a wait: the bridge's HCCL waits never time out (WorkHCCL::wait), so the agent kills this
process's group when a job passes its deadline.
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
from gaudi_launch.wire import COLLECTIVE_MARKER


def say(record: dict) -> None:
    print(COLLECTIVE_MARKER + json.dumps(record, sort_keys=True), flush=True)


def one(info, job: dict, host: str) -> None:
    """One job: join its process group, time its all-reduces, say the result, leave the group."""
    os.environ.update({str(k): str(v) for k, v in job.get("env", {}).items()})
    size, loops = int(job.get("bytes", 32 << 20)), int(job.get("loops", 1000))
    rank, world = init_distributed(info, timeout_s=float(job.get("timeout", 130)))
    n = max(1, size // 4)
    buf = torch.ones(n, dtype=torch.float32, device=info.device)
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
            "step": "allreduce",
            "rank": rank,
            "host": host,
            "seconds": took,
            "bytes": n * 4,
            "ranks": world,
            "backend": info.dist_backend,
        }
    )
    dist.destroy_process_group()  # after a job every rank finished: nobody to wait on


def main() -> int:
    host = socket.gethostname()
    try:
        info = select_device()  # the card (LOCAL_RANK's): a card another process holds fails here
    except Exception as exc:
        say({"step": "ready", "rank": -1, "host": host, "error": f"{type(exc).__name__}: {exc}"[:500]})
        sys.stdout.flush()
        os._exit(1)
    say({"step": "ready", "rank": -1, "host": host})  # the agent starts a job's clock from here
    for line in sys.stdin:
        rank = int(os.environ.get("RANK", "0"))
        try:
            job = json.loads(line)
            one(info, job, host)
        except Exception as exc:
            say({"step": "allreduce", "rank": rank, "host": host, "error": f"{type(exc).__name__}: {exc}"[:500]})
            sys.stdout.flush()
            os._exit(1)  # not destroy_process_group: it can wait on a peer that failed
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
