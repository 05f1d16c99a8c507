"""``gaudi-launch env [--json]``: what this machine runs, for bug reports (like ``ds_report`` or
``accelerate env``). Torch-free: package versions come from their metadata, tools from their own
``--version``; nothing is imported that would load a device.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import sys
from typing import Any, Optional

from gaudi_launch.errors import UserError
from gaudi_launch.inputs.devices import detect_local_devices
from gaudi_launch.inputs.envfile import mask_env
from gaudi_launch.inputs.hostfile import read_hostfile
from gaudi_launch.inputs.hostnames import is_local_host
from gaudi_launch.inputs.spec import JobSpec
from gaudi_launch.plan import gaudi, scaleout
from gaudi_launch.plan.fabric import efa_present
from gaudi_launch.plan.multinode import configured_host_keys, ssh_args
from gaudi_launch.remote import probe
from gaudi_launch.remote.fanout import per_host

PACKAGES = (
    "gaudi-launch",
    "torch",
    "habana-torch-plugin",
    "habana-torch-dataloader",
    "optimum-habana",
    "transformers",
    "tokenizers",
    "accelerate",
    "deepspeed",
    "numpy",
    "paramiko",
    "typer",
    "pyyaml",
)
TOOLS = (
    ("OpenMPI", ["mpirun", "--version"]),
    ("pdsh", ["pdsh", "-V"]),
    ("Slurm", ["srun", "--version"]),
    ("OpenSSH", ["ssh", "-V"]),
    ("hl-smi", ["hl-smi", "-v"]),
    ("fi_info", ["fi_info", "--version"]),
)


def _package(name: str) -> Optional[str]:
    from importlib import metadata  # here: a launch does not pay for the env command's import

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _tool(argv: list[str]) -> Optional[str]:
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


def _nics() -> list[dict[str, str]]:
    out: list[dict[str, str]] = []
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


def _scaleout() -> dict[str, Any]:
    """This host's Gaudi generation, driver, NIC ports, libfabric and the scale-out path HCCL will take
    (plan/scaleout.py), from the pre-flight probe's own tool calls, run here."""
    cmd = probe.command(sys.executable, None, "/", "127.0.0.1", 9, None)
    try:
        done = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
        f = scaleout.parse_probe_block(probe.parse(done.stdout).scaleout)
    except (OSError, subprocess.SubprocessError) as exc:
        return {"error": f"probe failed: {exc}"}
    path = scaleout.decide(f)
    ports = (
        "not read"
        if f.ports_up is None
        else f"{f.ports_up} up, {len(f.ports_down)} down"
        + (f" ({', '.join(f.ports_down[:4])})" if f.ports_down else "")
    )
    return {
        "generation": {1: "Gaudi (first generation)", 2: "Gaudi 2", 3: "Gaudi 3"}.get(f.generation or 0),
        "device": f.device_name,
        "driver": f.driver,
        "firmware": _firmware(),
        "kernel": f.kernel,
        "libfabric": f.libfabric,
        "rdma_devices": list(f.rdma_devices),
        "gaudi_scaleout_ports": ports,
        # where HCCL's OFI plugin would find libhccl_ofi_wrapper.so (plan/scaleout.py); None: not looked
        "ofi_wrapper": None if f.ofi_wrapper is None else list(f.ofi_wrapper),
        "path": path.as_dict(),
    }


def _firmware() -> Optional[str]:
    """hl-smi --fw-versions (System Management Interface Tool page), every card's line joined (drift between
    cards is what it is read for); None without it."""
    if shutil.which("hl-smi") is None:
        return None
    try:
        done = subprocess.run(["hl-smi", "--fw-versions"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = [line.strip() for line in done.stdout.splitlines() if line.strip()]
    return "; ".join(lines) if done.returncode == 0 and lines else None


REPORTNCHECK = ("reportNcheck.py", "reportNcheck")
# Its -c pings every Gaudi/host NIC port: minutes on a full server, never the whole report's life.
REPORTNCHECK_TIMEOUT_S = 300


def _reportncheck() -> Optional[dict[str, Any]]:
    """Habana's ReportNCheck (page "Intel Gaudi ReportNCheck Tool", installed with the RDMA PerfTest tool), when
    on PATH: its connectivity check, run as the page runs it (`python3 reportNcheck.py -c`: the python3 on PATH,
    where its pandas prerequisite was installed, not gaudi-launch's own interpreter). The verdict is its exit
    status and last line (stdout's, else stderr's); the page shows no output or exit status, so that reading is
    untested against the real tool. A check that outlives REPORTNCHECK_TIMEOUT_S is killed with everything it
    started and reported as timed out. None when it is not installed."""
    tool = next((shutil.which(name) for name in REPORTNCHECK if shutil.which(name)), None)
    if tool is None:
        return None
    python = shutil.which("python3") or sys.executable
    argv = [python, tool, "-c"] if tool.endswith(".py") else [tool, "-c"]
    try:
        proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            start_new_session=True,  # its own group: a timeout kills the perftest runs it started too
        )
    except OSError as exc:
        return {"tool": tool, "ok": False, "verdict": f"did not run: {exc}"}
    try:
        out, err = proc.communicate(timeout=REPORTNCHECK_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:  # it ended just now
            pass
        proc.communicate()
        return {"tool": tool, "ok": False, "verdict": f"timed out after {REPORTNCHECK_TIMEOUT_S} s (no verdict)"}
    lines = [line.strip() for line in out.splitlines() if line.strip()]
    lines = lines or [line.strip() for line in err.splitlines() if line.strip()]
    verdict = lines[-1] if lines else "no output"
    if proc.returncode != 0:
        verdict += f" (exit {proc.returncode})"
    return {"tool": tool, "ok": proc.returncode == 0, "verdict": verdict}


def collect() -> dict[str, Any]:

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
        # lazy or eager for a script without --use_lazy_mode/--torch_compile (plan/gaudi.py)
        "execution_mode": " ".join(_mode(gaudi.execution_mode(os.environ, [], gaudi.stack_version()))),
        "scaleout": _scaleout(),
        "reportncheck": _reportncheck(),
        "nics": _nics(),
        "env": mask_env(  # HCCL_SOCKET_TOKEN, a PT_HPU_LAZY_*PASSWORD: never in clear
            {
                k: os.environ[k]
                for k in sorted(os.environ)
                if k.startswith(("HABANA_VISIBLE", "PT_HPU_LAZY", "HCCL_SOCKET", "HCCL_OVER_OFI"))
            }
        ),
    }


def _mode(found: tuple[str, str]) -> tuple[str, str]:
    return found[0], f"({found[1]})"


def render(info: dict[str, Any]) -> str:
    lines = [f"gaudi-launch env ({info['host']})", ""]
    lines.append(f"{'OS':24} {info['os']}")
    lines.append(f"{'Python':24} {info['python']}")
    lines.append(f"{'CPUs':24} {info['cpus']}")
    dev = info["devices"]
    lines.append(f"{'devices':24} {dev['count']} {dev['kind']} ({dev['source']})")
    lines.append(f"{'EFA':24} {'yes' if info['efa'] else 'no'}")
    if info.get("execution_mode"):
        lines.append(f"{'execution mode':24} {info['execution_mode']}")
    lines += _scaleout_lines(info)
    lines.append(f"{'NICs':24} " + ", ".join(f"{n['name']} ({n['state']})" for n in info["nics"]))
    lines += ["", "packages:"]
    lines += [f"  {name:22} {version or 'not installed'}" for name, version in info["packages"].items()]
    lines += ["", "tools:"]
    lines += [f"  {name:22} {version or 'not found'}" for name, version in info["tools"].items()]
    if info["env"]:
        lines += ["", "environment:"] + [f"  {k}={v}" for k, v in info["env"].items()]
    return "\n".join(lines) + "\n"


def _scaleout_lines(info: dict[str, Any]) -> list[str]:
    """The scale-out part of the text report: generation, driver, firmware, ports, libfabric, path. Pure."""
    so = info.get("scaleout") or {}
    if "error" in so:
        return [f"{'scale-out':24} {so['error']}"]
    if not so:
        return []
    path = so.get("path") or {}
    lines = [
        f"{'Gaudi':24} {so.get('generation') or 'unknown (no hl-smi answer)'}"
        + (f" ({so['device']})" if so.get("device") else ""),
        f"{'driver':24} {so.get('driver') or '-'}",
        f"{'firmware':24} {so.get('firmware') or '-'}",
        f"{'Gaudi scale-out ports':24} {so.get('gaudi_scaleout_ports')}",
        f"{'libfabric':24} {so.get('libfabric') or 'not found (no fi_info)'}",
        f"{'RDMA devices':24} {', '.join(so.get('rdma_devices') or []) or 'none'}",
        f"{'OFI wrapper':24} "
        + (
            "-" if so.get("ofi_wrapper") is None else "; ".join(so["ofi_wrapper"]) or "libhccl_ofi_wrapper.so not found"
        ),
        f"{'scale-out path':24} {path.get('path')} {path.get('name')}"
        + (f" if {' and '.join(path['if'])}, else {path.get('else')}" if path.get("if") else "")
        + f": {path.get('why')}",
    ]
    rnc = info.get("reportncheck")
    lines.append(
        f"{'ReportNCheck':24} "
        + ("not installed" if not rnc else f"{'OK' if rnc['ok'] else 'FAILED'}: {rnc['verdict']} ({rnc['tool']} -c)")
    )
    return lines


def _scaleout_row(line: str) -> tuple[str, str]:
    return line[:24].strip(), line[25:]


def flatten(info: dict[str, Any]) -> dict[str, str]:
    """One text value per line of the per-host table. Pure."""
    dev = info["devices"]
    rows = {
        "OS": info["os"],
        "Python": info["python"].split(" (")[0],
        "CPUs": str(info["cpus"]),
        "devices": f"{dev['count']} {dev['kind']}",
        "EFA": "yes" if info["efa"] else "no",
        "execution mode": info.get("execution_mode", "-").split(" (")[0],
        **{k: v for k, v in (_scaleout_row(line) for line in _scaleout_lines(info))},
        "NICs": ", ".join(n["name"] for n in info["nics"]),
    }
    rows.update({name: version or "-" for name, version in info["packages"].items()})
    rows.update({name: version or "-" for name, version in info["tools"].items()})
    rows.update({k: v for k, v in info["env"].items()})
    return rows


def render_hosts(per_host: dict[str, dict[str, Any]], failed: dict[str, str]) -> str:
    """A row per fact, a column per host; '*' marks what differs between hosts. Pure."""
    hosts = list(per_host)
    flat = {h: flatten(i) for h, i in per_host.items()}
    keys = list(dict.fromkeys(k for h in hosts for k in flat[h]))
    lines = [f"gaudi-launch env: {len(hosts)} host(s); * marks what differs between them", ""]
    width = max([len(k) for k in keys] + [8]) + 2
    lines.append(" " * (width + 2) + " | ".join(hosts))
    for key in keys:
        values = [flat[h].get(key, "-") for h in hosts]
        mark = "*" if len(set(values)) > 1 else " "
        lines.append(f"{mark} {key:{width}}" + " | ".join(values))
    for host, why in failed.items():
        lines.append(f"! {host}: {why}")
    return "\n".join(lines) + "\n"


def collect_hosts(hostfile: str, ssh_options: list[str], python: str) -> tuple[dict[str, Any], dict[str, str]]:
    """Every hostfile host's report: this machine's directly, the others' over ssh (the same
    gaudi-launch there, as for a job). Returns (reports by host, why it failed by host)."""

    names = [h.name for h in read_hostfile(hostfile)]

    def one(host: str) -> Any:
        if is_local_host(host):
            return collect()
        remote = shlex.join([python, "-m", "gaudi_launch", "env", "--json"])
        try:
            done = subprocess.run(
                ["ssh", *ssh_options, host, remote],
                capture_output=True,
                text=True,
                timeout=60,
                stdin=subprocess.DEVNULL,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            return f"ssh failed: {exc}"
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            return f"ssh exited {done.returncode}: {last}"
        try:
            return json.loads(done.stdout)
        except ValueError:
            return "its gaudi-launch env printed no JSON"

    results = per_host(names, one, name="env")
    return (
        {h: r for h, r in results.items() if isinstance(r, dict)},
        {h: r for h, r in results.items() if not isinstance(r, dict)},
    )


def report(
    *,
    json_out: bool = False,
    hostfile: Optional[str] = None,
    ssh_config: Optional[str] = None,
    ssh_port: Optional[int] = None,
    ssh_identity: Optional[str] = None,
    python: str = sys.executable,
) -> int:
    """`gaudi-launch env` (its options are parsed in cli.py): this machine, or every host of ``hostfile``."""
    if not hostfile:
        info = collect()
        sys.stdout.write(json.dumps(info, indent=2) + "\n" if json_out else render(info))
        return 0

    spec = JobSpec(
        program=[],
        hostfile=hostfile,
        ssh_config=ssh_config,
        ssh_port=ssh_port,
        ssh_identity=ssh_identity,
    )
    try:
        names = [h.name for h in read_hostfile(hostfile)]
        options = ssh_args(spec, configured_host_keys(names, ssh_config))  # what a job's ssh gets
        per_host, failed = collect_hosts(hostfile, options, python)
    except UserError as exc:
        print(f"gaudi-launch env: error: {exc}", file=sys.stderr)
        return exc.exit_code
    if json_out:
        sys.stdout.write(json.dumps({"hosts": per_host, "unreachable": failed}, indent=2) + "\n")
    else:
        sys.stdout.write(render_hosts(per_host, failed))
    return 3 if failed else 0
