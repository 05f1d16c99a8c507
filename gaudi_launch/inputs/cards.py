"""A host's Gaudi cards as hl-smi and sysfs describe them, and the decisions made from that: which cards a
partial node may take, which card another process holds, and the cores each rank is bound to.

Cards are named by module id, never by index: "Device indices can change after a reboot or driver
reinstallation, while module ID set with HABANA_VISIBLE_MODULES remains the same" (Habana, "Multiple Dockers
Each with a Single Workload", `hl-smi -Q index,module_id -f csv`), and a rank takes the card whose module id
equals its local rank, or the local-rank-th entry of HABANA_VISIBLE_MODULES ("Gaudi-to-process Assignment").
The parsers and decisions are pure; ``read_host`` does the I/O (hl-smi, /sys). Stdlib only: the rank bootstrap
imports this before the user's script.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Optional

# "Multiple Workloads on a Single Docker": only 2-card and 4-card partial workloads are supported, with
# these module ids.
SUPPORTED_SUBSETS = (
    frozenset({0, 1}),
    frozenset({2, 3}),
    frozenset({4, 5}),
    frozenset({6, 7}),
    frozenset({0, 1, 2, 3}),
    frozenset({4, 5, 6, 7}),
)
QUERY = ["hl-smi", "-Q", "index,module_id,bus_id", "-f", "csv,noheader"]


@dataclass(frozen=True)
class Card:
    index: int
    module_id: int
    bus_id: str  # PCI address as hl-smi prints it, 0000:19:00.0


@dataclass
class HostCards:
    """What this host says about its cards and CPUs (empty when it has no hl-smi or no NUMA facts)."""

    cards: list[Card] = field(default_factory=list)
    numa_of_bus: dict[str, int] = field(default_factory=dict)  # bus id -> NUMA node (-1: none)
    node_cpus: dict[int, list[int]] = field(default_factory=dict)  # NUMA node -> its online CPUs
    holders: dict[int, list[tuple[str, str]]] = field(default_factory=dict)  # card index -> [(pid, name)]


def parse_query(text: str) -> list[Card]:
    """`hl-smi -Q index,module_id,bus_id -f csv[,noheader]` as cards; a header or odd line is skipped. Pure."""
    cards = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 3 and parts[0].isdigit() and parts[1].isdigit():
            cards.append(Card(index=int(parts[0]), module_id=int(parts[1]), bus_id=parts[2].lower()))
    return cards


# A held card's row is wider than the table and has no closing bar (hl-smi's output in ray-project/ray,
# doc/source/serve/tutorials/intel-gaudi-inference.md: "|   7       107684     C   ray::_RayTrainW   16770MiB").
_PROCESS_ROW = re.compile(r"^\|\s*(\d+)\s+(\d+)\s+(\S+)\s+(.*?)\s+(\S+)\s*\|?$")


def parse_processes(summary: str) -> dict[int, list[tuple[str, str]]]:
    """The "Compute Processes" part of plain `hl-smi`: card index -> [(pid, process name)] for rows that name a
    process (an idle card's row reads N/A). Pure."""
    holders: dict[int, list[tuple[str, str]]] = {}
    lines = summary.splitlines()
    start = next((i for i, line in enumerate(lines) if "Compute Processes" in line), None)
    for line in lines[start + 1 :] if start is not None else []:
        m = _PROCESS_ROW.match(line.strip())
        if m:
            holders.setdefault(int(m.group(1)), []).append((m.group(2), m.group(4).strip()))
    return holders


def parse_cpulist(text: str) -> list[int]:
    """sysfs's cpulist ('0-27,56-83') as CPU numbers. Pure."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        lo, _, hi = part.strip().partition("-")
        if lo.isdigit() and (not hi or hi.isdigit()):
            cpus.extend(range(int(lo), int(hi or lo) + 1))
    return cpus


def partial_node_problem(modules: Sequence[int], total: int) -> Optional[str]:
    """Why this set of module ids is not a partial node Habana supports, or None. A whole node (every card the
    host has) and a single card are fine. Pure."""
    chosen = frozenset(modules)
    if len(chosen) <= 1 or len(chosen) >= total or chosen in SUPPORTED_SUBSETS:
        return None
    ids = ",".join(map(str, sorted(chosen)))
    return (
        f"module ids {ids}: Habana supports partial nodes of 2 or 4 cards only, with module ids 0,1 / 2,3 / 4,5 / "
        "6,7 or 0-3 / 4-7 (Habana's page 'Multiple Workloads on a Single Docker')"
    )


def rank_modules(local_ranks: int, visible: Optional[str]) -> list[int]:
    """The module id each local rank's card has: HABANA_VISIBLE_MODULES' entries in order, else the local rank
    itself ("Gaudi-to-process Assignment"). Pure."""
    ids = [int(x) for x in (visible or "").split(",") if x.strip().isdigit()]
    return [ids[r] if r < len(ids) else r for r in range(local_ranks)]


def rank_cores(modules: Sequence[int], host: HostCards) -> list[Optional[list[int]]]:
    """Per rank (in order), the cores it is bound to: its card's NUMA node's CPUs, split in equal disjoint
    shares among the ranks whose cards sit on that node (Habana's `mpirun --map-by socket:PE=<cores per card>`
    rule, per NUMA node instead of per socket). None for a rank whose card or node is unknown. Pure."""
    node_of_module = {c.module_id: host.numa_of_bus.get(c.bus_id, -1) for c in host.cards}
    nodes = [node_of_module.get(m, -1) for m in modules]
    out: list[Optional[list[int]]] = []
    for rank, node in enumerate(nodes):
        cpus = host.node_cpus.get(node) if node is not None and node >= 0 else None
        if not cpus:
            out.append(None)
            continue
        sharing = [r for r, n in enumerate(nodes) if n == node]
        out.append(_share(cpus, sharing.index(rank), len(sharing)))
    return out


def _runs(cpus: Sequence[int]) -> list[list[int]]:
    """Contiguous runs of CPU numbers: '0-39,80-119' is two, the cores and their hyperthreads. Pure."""
    runs: list[list[int]] = []
    for c in sorted(set(cpus)):
        if runs and c == runs[-1][-1] + 1:
            runs[-1].append(c)
        else:
            runs.append([c])
    return runs


def _share(cpus: Sequence[int], k: int, n: int) -> list[int]:
    """The k-th of n equal shares of a node's CPUs: the k-th part of each contiguous run, so that a rank gets
    cores with their hyperthread siblings (Linux numbers the siblings of cores 0-39 as 80-119), not only
    siblings. The whole node when it has fewer CPUs than ranks. Pure."""
    runs = _runs(cpus)
    if all(len(r) >= n for r in runs):
        out: list[int] = []
        for r in runs:
            size = len(r) // n
            out += r[k * size : (k + 1) * size]
        return out
    size = len(cpus) // n
    return sorted(cpus)[k * size : (k + 1) * size] if size else sorted(cpus)


def _run(argv: list[str]) -> Optional[str]:
    if not shutil.which(argv[0]):
        return None
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def _read(path: str) -> Optional[str]:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def read_host(sysfs: str = "/sys", processes: bool = False) -> HostCards:
    """This host's cards (hl-smi), their NUMA nodes (/sys/bus/pci/devices/<bus>/numa_node) and each node's CPUs
    (/sys/devices/system/node/nodeN/cpulist); with ``processes`` also who holds which card (plain hl-smi)."""
    host = HostCards(cards=parse_query(_run(QUERY) or ""))
    for card in host.cards:
        value = (_read(os.path.join(sysfs, "bus", "pci", "devices", card.bus_id, "numa_node")) or "").strip()
        host.numa_of_bus[card.bus_id] = int(value) if value.lstrip("-").isdigit() else -1
    for node in sorted({n for n in host.numa_of_bus.values() if n >= 0}):
        text = _read(os.path.join(sysfs, "devices", "system", "node", f"node{node}", "cpulist"))
        if text:
            host.node_cpus[node] = parse_cpulist(text)
    if processes and host.cards:
        host.holders = parse_processes(_run(["hl-smi"]) or "")
    return host


def held_cards(modules: Sequence[int], host: HostCards, mine: Mapping[str, bool]) -> list[str]:
    """For each wanted card another process holds, a line naming it (module id, index, pid and name). ``mine``:
    pids to ignore (this job's own). Pure."""
    index_of = {c.module_id: c.index for c in host.cards}
    out = []
    for m in modules:
        idx = index_of.get(m)
        for pid, name in host.holders.get(idx, []) if idx is not None else []:
            if not mine.get(pid):
                out.append(f"card module {m} (index {idx}) is held by process {pid} ({name})")
    return out
