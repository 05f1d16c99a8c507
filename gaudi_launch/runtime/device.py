"""Device selection, HPU environment set-up, process groups and memory statistics.

HPU code imports ``habana_frameworks`` lazily and only on the HPU path: it is not on PyPI, and
importing it freezes settings read from the environment (lazy mode, autocast op lists), so
``prepare_hpu_env`` (hpu_env.py; the worker runs it before the script) must come first.
"""

from __future__ import annotations

import datetime
import importlib
import importlib.util
import os
import sys
from dataclasses import dataclass
from typing import Any, Optional

import torch

from gaudi_launch.wire import DEVICE

from .hpu_env import LAZY_VAR, prepare_hpu_env  # noqa: F401  (prepare_hpu_env: part of this module's API)

_BACKENDS = {"hpu": "hccl", "cuda": "nccl", "cpu": "gloo"}


class DeviceUnavailable(RuntimeError):
    """The device asked for cannot be used here; the message says why and what to do."""


@dataclass
class DeviceInfo:
    kind: str  # "hpu" | "cuda" | "cpu"
    device: torch.device
    dist_backend: str  # "hccl" | "nccl" | "gloo"
    lazy: bool  # HPU lazy mode: ops are queued into a graph until mark_step()
    local_rank: int


# ----------------------------------------------------------------------------------------------
# Device selection


def _local_rank(args: Any) -> int:
    # The launcher's contract (worker.normalize_env) puts LOCAL_RANK in the env; --local_rank is
    # only what DeepSpeed's launcher appends, and says the same thing.
    env = os.environ.get("LOCAL_RANK", "")
    if env.lstrip("-").isdigit():
        return int(env)
    rank = getattr(args, "local_rank", -1) if args is not None else -1
    return rank if rank is not None and rank >= 0 else 0


def _auto_kind() -> str:
    if importlib.util.find_spec("habana_frameworks") is not None:
        return "hpu"
    if torch.cuda.is_available():
        return "cuda"
    return "cpu"


def select_device(args: Any = None, force: Optional[str] = None) -> DeviceInfo:
    # --device on gaudi-launch reaches every rank as GAUDI_LAUNCH_DEVICE; the script's own wins.
    # --use_habana asks for a Gaudi: no silent fall-back to the CPU when there is none.
    kind = (
        force
        or (getattr(args, "device", None) if args is not None else None)
        or os.environ.get(DEVICE)
        or ("hpu" if getattr(args, "use_habana", False) else None)
        or _auto_kind()
    )
    if kind not in _BACKENDS:
        raise ValueError(f"unknown device {kind!r}: expected hpu, cuda or cpu")
    local_rank = _local_rank(args)
    if kind == "hpu":
        _load_bridge(args)
        return DeviceInfo("hpu", torch.device("hpu"), "hccl", bridge_is_lazy(), local_rank)
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise DeviceUnavailable("device 'cuda' requested but torch.cuda.is_available() is False")
        # CUDA_VISIBLE_DEVICES may already narrow the view to one device per rank.
        index = local_rank % max(1, torch.cuda.device_count())
        device = torch.device("cuda", index)
        torch.cuda.set_device(device)
        return DeviceInfo("cuda", device, "nccl", False, local_rank)
    return DeviceInfo("cpu", torch.device("cpu"), "gloo", False, local_rank)


def _load_bridge(args: Any) -> None:
    """Import the Gaudi bridge, with a clear error when it cannot load here."""
    if importlib.util.find_spec("habana_frameworks") is None:
        raise DeviceUnavailable(
            "device 'hpu' requested but habana_frameworks is not importable here: it comes with "
            "Intel Gaudi's software stack (its containers), not PyPI. Run on a Gaudi host, or "
            "pass --device cpu"
        )
    if args is not None and "habana_frameworks.torch.core" not in sys.modules:
        prepare_hpu_env(args)  # lazy mode must be in the env before the import below
    try:
        importlib.import_module("habana_frameworks.torch.core")
        hpu = importlib.import_module("habana_frameworks.torch.hpu")
    except (ImportError, OSError, AssertionError, RuntimeError) as exc:
        # e.g. a torch the bridge was not built for, or no Gaudi driver on this host
        raise DeviceUnavailable(
            f"device 'hpu' requested but the Gaudi bridge did not load: {type(exc).__name__}: {exc}"
        ) from exc
    if not hpu.is_available():
        raise DeviceUnavailable(
            "device 'hpu' requested but habana_frameworks.torch.hpu.is_available() is False: "
            "no Gaudi device is usable by this process (driver, HABANA_VISIBLE_MODULES)"
        )


def bridge_is_lazy() -> bool:
    """Whether the loaded bridge runs in lazy mode: its own answer, which PT_HPU_LAZY_MODE decided
    when it loaded (the variable may have changed since)."""
    try:
        return bool(importlib.import_module("habana_frameworks.torch.utils.internal").is_lazy())
    except (ImportError, AttributeError):
        return os.environ.get(LAZY_VAR, "1") != "0"


def set_dynamic_shapes(info: DeviceInfo, enabled: bool) -> None:
    """The gaudi config's use_dynamic_shapes, as optimum-habana applies it (lazy mode)."""
    if info.kind == "hpu" and info.lazy:
        hpu = importlib.import_module("habana_frameworks.torch.hpu")
        (hpu.enable_dynamic_shape if enabled else hpu.disable_dynamic_shape)()


# ----------------------------------------------------------------------------------------------
# Process group


def init_distributed(info: DeviceInfo, timeout_s: float = 1800) -> tuple[int, int]:
    """(rank, world) from RANK/WORLD_SIZE; a process group only when world > 1."""
    import torch.distributed as dist

    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    rank = int(os.environ.get("RANK", "0") or 0)
    if world <= 1:
        return 0, 1
    if dist.is_initialized():  # idempotent: a script may call us after its own set-up
        return dist.get_rank(), dist.get_world_size()
    missing = [k for k in ("MASTER_ADDR", "MASTER_PORT") if not os.environ.get(k)]
    if missing:
        raise RuntimeError(
            f"WORLD_SIZE={world} but {' and '.join(missing)} not set: start the script with gaudi-launch (or torchrun)"
        )
    if info.dist_backend == "hccl":
        importlib.import_module("habana_frameworks.torch.distributed.hccl")  # registers "hccl"
    dist.init_process_group(
        info.dist_backend, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=timeout_s)
    )
    return rank, world


# ----------------------------------------------------------------------------------------------
# Step boundaries and synchronisation


def mark_step(info: DeviceInfo) -> None:
    """End the lazy graph (HPU lazy mode) so it is compiled and run; no-op elsewhere."""
    if info.kind == "hpu" and info.lazy:
        importlib.import_module("habana_frameworks.torch.core").mark_step()


def synchronize(info: DeviceInfo) -> None:
    if info.kind == "hpu":
        importlib.import_module("habana_frameworks.torch.hpu").synchronize()
    elif info.kind == "cuda":
        torch.cuda.synchronize(info.device)


# ----------------------------------------------------------------------------------------------
# Memory


def _gb(n_bytes: float) -> float:
    return round(n_bytes / 1024**3, 2)


def _proc_kb(path: str, key: str) -> Optional[int]:
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])  # "VmRSS:   123456 kB"
    except OSError:
        pass
    return None


def memory_stats(info: DeviceInfo) -> dict[str, float]:
    """optimum-habana's memory figures in GB (2 decimals); on CPU this process's resident memory."""
    if info.kind == "hpu":
        stats = importlib.import_module("habana_frameworks.torch.hpu").memory_stats()
        used, peak, total = stats["InUse"], stats["MaxInUse"], stats["Limit"]
    elif info.kind == "cuda":
        used = torch.cuda.memory_allocated(info.device)
        peak = torch.cuda.max_memory_allocated(info.device)
        total = torch.cuda.get_device_properties(info.device).total_memory
    else:
        rss = _proc_kb("/proc/self/status", "VmRSS")
        hwm = _proc_kb("/proc/self/status", "VmHWM")
        mem = _proc_kb("/proc/meminfo", "MemTotal")
        if rss is None:  # no /proc (macOS): the peak is all getrusage knows
            import resource

            scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, kB on Linux
            rss = hwm = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale // 1024
        used, peak = rss * 1024, max(hwm or rss, rss) * 1024
        total = (mem or 0) * 1024
    return {
        "memory_allocated (GB)": _gb(used),
        "max_memory_allocated (GB)": _gb(peak),
        "total_memory_available (GB)": _gb(total),
    }
