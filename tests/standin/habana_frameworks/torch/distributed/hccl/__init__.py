"""Stand-in for habana_frameworks.torch.distributed.hccl: an "hccl" backend for device "hpu" only.

As python_packages/habana_frameworks/torch/distributed/hccl/__init__.py (bridge 1.19):
``register_backend("hccl", ..., devices=["hpu"])``. A collective on CPU tensors in an hccl group
therefore fails ("No backend type associated with device type cpu"), as on Gaudi. Underneath, the
stand-in's collectives on hpu tensors run over gloo (see tests/standin/hpu_stand_in_device.py).
"""

from __future__ import annotations

import habana_frameworks.torch  # noqa: F401  (loads the stand-in device first, like the real package)
import torch.distributed as dist
from habana_frameworks import record


def _create_hccl(store, rank: int, world_size: int, timeout):
    record("hccl.create", rank=rank, world_size=world_size)
    return dist.ProcessGroupGloo(store, rank, world_size, timeout)


# As the real module does on import; re-registering (after a module purge) replaces the creator.
dist.Backend.register_backend("hccl", _create_hccl, devices=["hpu"])
record("hccl.import")
