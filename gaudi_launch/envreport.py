"""``gaudi-launch env [--json]``: what this machine runs, for bug reports (like ``ds_report`` or
``accelerate env``). Torch-free: package versions come from their metadata, tools from their own
``--version``; nothing is imported that would load a device.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
from importlib import metadata
from typing import Any, Dict, List, Optional

PACKAGES = ("gaudi-launch", "torch", "habana-torch-plugin", "habana-torch-dataloader", "optimum-habana",
            "transformers", "tokenizers", "accelerate", "deepspeed", "numpy", "paramiko", "typer")
TOOLS = (("OpenMPI", ["mpirun", "--version"]), ("pdsh", ["pdsh", "-V"]), ("Slurm", ["srun", "--version"]),
         ("OpenSSH", ["ssh", "-V"]), ("hl-smi", ["hl-smi", "-v"]), ("fi_info", ["fi_info", "--version"]))


def _package(name: str) -> Optional[str]:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _tool(argv: List[str]) -> Optional[str]:
    if shutil.which(argv[0]) is None:
        return None
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"present, {argv[0]} failed: {exc}"
    lines = [line.strip() for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    # the line with a version number, not a complaint printed before it (srun without SLURM_CONF)
    versioned = [line for line in lines if re.search(r"\d+\.\d+", line) and "error" not in line.lower()]
    if not versioned and done.returncode != 0:
        return f"present ({' '.join(argv)} failed: {lines[-1] if lines else 'no output'})"
    return (versioned or lines or ["present"])[0]


def _nics() -> List[Dict[str, str]]:
    out = []
    try:
        names = sorted(os.listdir("/sys/class/net"))
    except OSError:
        return out
    for name in names:
        try:
            with open(f"/sys/class/net/{name}/operstate") as f:
                state = f.read().strip()
        except OSError:
            state = "?"
        out.append({"name": name, "state": state})
    return out


def collect() -> Dict[str, Any]:
    from gaudi_launch.devices import detect_local_devices
    from gaudi_launch.fabric import efa_present

    devices = detect_local_devices()
    return {
        "host": platform.node(),
        "os": f"{platform.system()} {platform.release()} {platform.machine()}",
        "python": f"{platform.python_version()} ({sys.executable})",
        "cpus": os.cpu_count(),
        "packages": {name: _package(name) for name in PACKAGES},
        "tools": {name: _tool(argv) for name, argv in TOOLS},
        "devices": {"count": devices.count, "kind": devices.kind, "source": devices.source},
        "efa": efa_present(),
        "nics": _nics(),
        "env": {k: os.environ[k] for k in sorted(os.environ) if k.startswith(("HABANA_VISIBLE", "PT_HPU_LAZY",
                                                                               "HCCL_SOCKET", "HCCL_OVER_OFI"))},
    }


def render(info: Dict[str, Any]) -> str:
    lines = [f"gaudi-launch env ({info['host']})", ""]
    lines.append(f"{'OS':24} {info['os']}")
    lines.append(f"{'Python':24} {info['python']}")
    lines.append(f"{'CPUs':24} {info['cpus']}")
    dev = info["devices"]
    lines.append(f"{'devices':24} {dev['count']} {dev['kind']} ({dev['source']})")
    lines.append(f"{'EFA':24} {'yes' if info['efa'] else 'no'}")
    lines.append(f"{'NICs':24} " + ", ".join(f"{n['name']} ({n['state']})" for n in info["nics"]))
    lines += ["", "packages:"]
    lines += [f"  {name:22} {version or 'not installed'}" for name, version in info["packages"].items()]
    lines += ["", "tools:"]
    lines += [f"  {name:22} {version or 'not found'}" for name, version in info["tools"].items()]
    if info["env"]:
        lines += ["", "environment:"] + [f"  {k}={v}" for k, v in info["env"].items()]
    return "\n".join(lines) + "\n"


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(prog="gaudi-launch env",
                                     description="Versions, devices and network of this machine, for bug reports.")
    parser.add_argument("--json", action="store_true", help="one JSON object instead of text")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    info = collect()
    sys.stdout.write(json.dumps(info, indent=2) + "\n" if args.json else render(info))
    return 0
