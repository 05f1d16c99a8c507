"""Stand-in for habana_frameworks.torch.hpu."""
from __future__ import annotations

from habana_frameworks import record

# Read by gaudi_launch.runtime.device: tensors of the stand-in "HPU" live on the CPU.
_STAND_IN_TORCH_DEVICE = "cpu"

GB = 1024 ** 3
# Plausible Gaudi2 figures, in bytes, as the real memory_stats() reports them.
MEMORY = {"InUse": int(1.234 * GB), "MaxInUse": int(2.5 * GB), "Limit": int(94.62 * GB)}


def is_available() -> bool:
    return True


def device_count() -> int:
    return 8


def current_device() -> int:
    return 0


def synchronize() -> None:
    record("synchronize")


def memory_stats(device=None) -> dict:
    record("memory_stats")
    return dict(MEMORY, NumAllocs=1, NumFrees=0)


class ModuleCacher:
    """HPU graphs: the real one records and replays the module's graph; this one records the wrap."""

    def __init__(self, max_graphs: int = 10) -> None:
        self.max_graphs = max_graphs

    def __call__(self, model=None, inplace: bool = True, **kwargs):
        record("ModuleCacher", model=type(model).__name__, inplace=inplace, **kwargs)
        return model
