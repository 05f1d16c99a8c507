"""One host's facts, the same object whatever reached the host: the SSH pre-flight (mpirun, DeepSpeed), the
probe run as a local process (local backend), or one srun task per node (Slurm). Each runs the same probe
(remote/scripts/probe.sh) and ``remote.probe.read_facts`` turns its output into a HostFacts; the planner
plans from these alone, never from which backend collected them. Pure data and pure readers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from gaudi_launch.inputs import cards
from gaudi_launch.plan import scaleout


@dataclass
class HostFacts:
    host: str  # as the plan names it (the hostfile's, may be user@host; a Slurm node; localhost)
    ok: bool  # the pre-flight's verdict (reason and fix say why not); True where nothing judged it
    reason: Optional[str] = None
    fix: Optional[str] = None
    hostname: Optional[str] = None
    ip_addr: str = ""  # raw `ip -o addr show` output of that host
    ncpus: Optional[int] = None
    python_ok: Optional[bool] = None
    python_path: Optional[str] = None  # `command -v` of the workers' python there
    script_ok: Optional[bool] = None
    cwd: Optional[str] = None  # the working directory the probe was asked about
    cwd_ok: Optional[bool] = None
    devices: Optional[int] = None  # hl-smi count when hl-smi exists, else None (not checked)
    openmpi: Optional[str] = None  # `mpirun --version` first line
    deepspeed: Optional[str] = None  # deepspeed version of the workers' python
    python_version: Optional[str] = None  # the workers' python, and what it would import (remote/versions.py)
    torch: Optional[str] = None
    transformers: Optional[str] = None
    habana_bridge: Optional[str] = None
    master_ip: Optional[str] = None  # the master's address as this host resolves it
    master_reachable: Optional[bool] = None
    port_free: Optional[bool] = None  # only for the master host
    elapsed_s: float = 0.0
    fabric: Optional[scaleout.HostFabric] = None  # scale-out facts (Gaudi generation, NIC ports, libfabric)
    cards: Optional[cards.HostCards] = None  # its cards by module id, their NUMA nodes, who holds them
    # Read by the one-host probe (remote/hostprobe.py: this machine, no Python checks, no scale-out links): its
    # fabric says the generation and RDMA devices but decides no scale-out path.
    one_host: bool = False


def sections(block: str) -> dict[str, list[str]]:
    """The probe's ``@@<command>`` sections (probe.sh, _scaleout) by command. Pure."""
    out: dict[str, list[str]] = {}
    current: Optional[list[str]] = None
    for line in block.splitlines():
        if line.startswith("@@"):
            current = out.setdefault(line[2:].strip(), [])
        elif current is not None:
            current.append(line)
    return out


def host_cards(block: str) -> cards.HostCards:
    """A host's cards, who holds them, their NUMA nodes and each node's CPUs, from the probe's hl-smi and
    sysfs sections (probe.sh). Pure."""
    found = sections(block)
    host = cards.HostCards(
        cards=cards.parse_query("\n".join(found.get("hl-smi -Q index,module_id,bus_id -f csv,noheader", [])))
    )
    host.holders = cards.parse_processes("\n".join(found.get("hl-smi", [])))
    for line in found.get("numa", []):
        name, _, value = line.strip().partition(" ")
        if name.startswith("node") and name[4:].isdigit():
            host.node_cpus[int(name[4:])] = cards.parse_cpulist(value)
        elif value.strip().lstrip("-").isdigit():
            host.numa_of_bus[name.lower()] = int(value)
    return host
