"""The pre-flight's probe: what runs on each host (scripts/probe.sh and scripts/probe_checks.py, package
data, shellchecked by the tests) and what it found, as a typed result.

``command`` is the one remote command line: ``set --`` with every value shlex-quoted, then the static
script. ``parse`` reads its output. Both pure; preflight.py does the I/O and judges the result.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, fields
from functools import cache
from typing import Optional, Union

from gaudi_launch.plan import scaleout
from gaudi_launch.plan.hostfacts import HostFacts, host_cards

BEGIN = "@@gaudi-launch-probe begin"
END = "@@gaudi-launch-probe end"
IP_BEGIN = "@@ip-addr begin"
IP_END = "@@ip-addr end"
SCALEOUT_BEGIN = "@@scaleout begin"  # the scale-out tools' output, verbatim (plan/scaleout.parse_probe_block)
SCALEOUT_END = "@@scaleout end"
# The agent's interpreter leaves the working directory off sys.path before the checks (after the cd, a
# stray socket.py there must not matter).
_AGENT_FIRST = "import sys\nsys.path[:] = [p for p in sys.path if p not in ('', '.')]\n"


@dataclass
class ProbeResult:
    """What the probe said. None: not said (the probe stopped early, or the check could not run)."""

    complete: bool = False  # the end marker was seen
    hostname: Optional[str] = None
    ncpus: Optional[int] = None
    python_path: Optional[str] = None  # `command -v` of the workers' python
    python_ok: Optional[bool] = None  # the python ran
    python_version: Optional[str] = None
    gaudi_launch_ok: Optional[bool] = None  # that python finds gaudi_launch.process.worker as the ranks' -m will
    gaudi_launch_path: Optional[str] = None  # where its gaudi_launch package is
    gaudi_launch_error: Optional[str] = None  # why it does not (the exception, one line)
    deepspeed: Optional[str] = None  # its deepspeed's version
    torch: Optional[str] = None  # its torch's version (dist-info), "unknown" when there is none
    transformers: Optional[str] = None
    habana_bridge: Optional[str] = None  # habana-torch-plugin's version
    openmpi: Optional[str] = None  # `mpirun --version`, first line
    devices: Optional[int] = None  # hl-smi's count; None also when there is no hl-smi
    devices_error: Optional[str] = None
    cwd_ok: Optional[bool] = None
    script_ok: Optional[bool] = None  # None when no script was given
    master_ip: Optional[str] = None  # the master's address as this host resolves it
    master_reachable: Optional[bool] = None
    master_error: Optional[str] = None
    port_free: Optional[bool] = None  # asked on the master only
    port_error: Optional[str] = None
    ip_addr: str = ""  # `ip -o addr show`, raw
    scaleout: str = ""  # hl-smi / fi_info / sysfs output for the scale-out path, raw


@cache
def _script(name: str) -> str:
    # beside this module (package data); importlib.resources would load zipfile, bz2 and lzma for it
    with open(os.path.join(os.path.dirname(__file__), "scripts", name), encoding="utf-8") as f:
        return f.read()


def command(
    python: str,
    script: Optional[str],
    cwd: str,
    master_addr: str,
    master_ssh_port: int,
    check_port: Optional[int],
    agent: Optional[str] = None,
    one_host: bool = False,
    pythonpath: Optional[str] = None,
    checks_by_caller: bool = False,
) -> str:
    """The probe's command line for one host (POSIX sh). Pure.

    ``agent``: Python code the session goes on with after the probe (sshmux.SESSION_AGENT), in the
    interpreter that ran the checks (one start, not two): the checks then run last, print the end
    marker themselves and read the session's stdin afterwards. ``one_host``: the facts a job on this host
    alone plans with (cards, NUMA, CPUs, addresses), without the Python checks and the scale-out links, which
    matter only between hosts (the local backend's probe, run here). ``pythonpath``: the PYTHONPATH the job
    gives its ranks, searched after ``cwd`` (as the ranks' sys.path has them) when the checks look for
    gaudi_launch's worker. ``checks_by_caller``: every fact but the Python checks' (``checks_code`` with
    ``checks_argv``), which the caller runs in its own interpreter: the one-pass rank's bootstrap (process/gate.py),
    one interpreter start less per host.
    """
    if checks_by_caller:
        code = "by the caller"  # (not run; not empty: the facts between hosts are wanted)
    elif one_host and agent is None:  # a one-host job's facts: no Python started, nothing between hosts
        code = ""
    elif agent is None:
        code = checks_code()
    else:
        code = f"{_AGENT_FIRST}{checks_code()}print({END!r})\nsys.stdout.flush()\n{agent}"
    mode = "2" if checks_by_caller else "0" if agent is None else "1"
    argv = [
        python,
        cwd,
        script or "",
        code,
        mode,
        *checks_argv(cwd, pythonpath, master_addr, master_ssh_port, check_port),
    ]
    return f"set -- {shlex.join(argv)}\n{_script('probe.sh')}"


def checks_code() -> str:
    """The probe's checks that need Python (scripts/probe_checks.py), as ``python -c`` runs them."""
    return _script("probe_checks.py")


def checks_argv(
    cwd: str, pythonpath: Optional[str], master_addr: str, master_ssh_port: int, check_port: Optional[int]
) -> list[str]:
    """The checks' argv after the program's name: the ranks' first sys.path entries (the working directory, the
    job's PYTHONPATH), the master and the port its sshd listens on, and on the master the job's port. Pure."""
    search = ":".join([cwd, *(pythonpath.split(":") if pythonpath else [])])
    return [search, master_addr, str(int(master_ssh_port)), *([str(int(check_port))] if check_port is not None else [])]


_BOOLS = {"1": True, "0": False, "true": True, "false": False, "yes": True, "no": False}
_TYPES = {f.name: str(f.type) for f in fields(ProbeResult)}


def parse(text: Union[str, bytes]) -> ProbeResult:
    """The probe's output as a ProbeResult. Pure; unknown keys, bad values and garbage are skipped, and
    whatever a login script printed before the begin marker is ignored."""
    out = ProbeResult()
    if not isinstance(text, str):
        text = bytes(text).decode("utf-8", "replace")
    lines = text.replace("\r\n", "\n").split("\n")
    stripped = [line.strip() for line in lines]
    if BEGIN in stripped:
        lines = lines[stripped.index(BEGIN) + 1 :]
    in_ip, ip_lines = False, []
    in_so, so_lines = False, []
    for raw in lines:
        line = raw.strip()
        if line in (SCALEOUT_BEGIN, SCALEOUT_END) and not in_ip:
            in_so = line == SCALEOUT_BEGIN
        elif in_so:
            so_lines.append(raw)
        elif line in (IP_BEGIN, IP_END):
            in_ip = line == IP_BEGIN
        elif in_ip:
            ip_lines.append(raw)
        elif line == END:
            out.complete = True
        elif "=" in line:
            key, value = (part.strip() for part in line.split("=", 1))
            if key in _TYPES and key not in ("complete", "ip_addr", "scaleout"):
                setattr(out, key, _value(_TYPES[key], value, getattr(out, key)))
    out.ip_addr = "\n".join(ip_lines) + ("\n" if ip_lines else "")
    out.scaleout = "\n".join(so_lines) + ("\n" if so_lines else "")
    return out


def read_facts(
    host: str, text: Union[str, bytes], *, script: Optional[str] = None, cwd: Optional[str] = None
) -> HostFacts:
    """A host's facts from its probe's output, however the output came (ssh, a launcher's daemon, an srun task,
    ``sh`` here): the one reader every backend's facts go through. Nothing judged yet (``ok`` True, no reason):
    the pre-flight judges what the job needs (preflight._judge). Pure."""
    return facts_of(host, parse(text), script=script, cwd=cwd)


def facts_of(host: str, found: ProbeResult, *, script: Optional[str] = None, cwd: Optional[str] = None) -> HostFacts:
    """read_facts from an already parsed probe. Pure."""
    return HostFacts(
        host=host,
        ok=True,
        hostname=found.hostname,
        ip_addr=found.ip_addr,
        ncpus=found.ncpus,
        python_ok=found.python_ok,
        python_path=found.python_path,
        script_ok=found.script_ok if script else None,
        cwd=cwd,
        cwd_ok=found.cwd_ok,
        devices=found.devices,
        openmpi=found.openmpi,
        deepspeed=found.deepspeed,
        python_version=found.python_version,
        torch=found.torch,
        transformers=found.transformers,
        habana_bridge=found.habana_bridge,
        master_ip=found.master_ip,
        master_reachable=found.master_reachable,
        port_free=found.port_free,
        fabric=scaleout.parse_probe_block(found.scaleout) if found.scaleout else None,
        cards=host_cards(found.scaleout) if found.scaleout else None,
    )


def _value(kind: str, value: str, before):
    """A field's value from its text, or what it was when the text does not fit. Pure."""
    if "int" in kind:
        return int(value) if value.isdigit() else before
    if "bool" in kind:
        return _BOOLS.get(value.lower(), before)
    return value or before
