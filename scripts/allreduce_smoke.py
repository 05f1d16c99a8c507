"""A real multi-rank torch.distributed job: every rank contributes rank+1, all ranks check the sum.

Launch it with gaudi-launch (it reads the env contract: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT):
    gaudi-launch --num_devices 2 scripts/allreduce_smoke.py
"""

import datetime
import os
import socket
import sys

import torch
import torch.distributed as dist


def main() -> int:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    expected = world * (world + 1) / 2
    ok = t.item() == expected
    print(
        f"rank {rank}/{world} on {socket.gethostname()} (local rank {os.environ['LOCAL_RANK']}): "
        f"all_reduce sum = {t.item():g}, expected {expected:g}: {'OK' if ok else 'WRONG'}",
        flush=True,
    )
    dist.barrier()
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
