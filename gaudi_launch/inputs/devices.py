"""How many accelerators this host has, found without importing torch."""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class DeviceCount:
    count: int
    kind: str  # "hpu", "cuda" or "cpu"
    source: str  # how it was found, shown in --dry-run


def _count_list(value: str) -> int:
    return len([v for v in value.split(",") if v.strip()])


def _run_lines(argv) -> Optional[list]:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=15, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return [line for line in out.splitlines() if line.strip()]


def detect_local_devices(environ: Optional[Mapping[str, str]] = None) -> DeviceCount:
    env = os.environ if environ is None else environ
    # Gaudi: an explicit restriction wins, then the driver's tool, then the device nodes.
    if env.get("HABANA_VISIBLE_MODULES", "").strip():
        return DeviceCount(_count_list(env["HABANA_VISIBLE_MODULES"]), "hpu", "HABANA_VISIBLE_MODULES")
    if shutil.which("hl-smi"):
        lines = _run_lines(["hl-smi", "-Q", "module_id", "-f", "csv,noheader"])
        if lines:
            return DeviceCount(len(lines), "hpu", "hl-smi")
    nodes = [p for p in glob.glob("/dev/accel/accel*") + glob.glob("/dev/hl*") if re.search(r"/(accel|hl)\d+$", p)]
    if nodes:
        return DeviceCount(len(nodes), "hpu", "/dev/accel")
    # CUDA, still torch-free.
    if "CUDA_VISIBLE_DEVICES" in env:
        n = _count_list(env["CUDA_VISIBLE_DEVICES"])
        if n:
            return DeviceCount(n, "cuda", "CUDA_VISIBLE_DEVICES")
    if shutil.which("nvidia-smi"):
        lines = _run_lines(["nvidia-smi", "-L"])
        gpus = [line for line in lines or [] if line.startswith("GPU ")]
        if gpus:
            return DeviceCount(len(gpus), "cuda", "nvidia-smi")
    return DeviceCount(1, "cpu", "no accelerator found: one rank (use --num_devices for more)")
