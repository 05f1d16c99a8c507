"""What a job's ranks get on a Gaudi host besides the rank layout, and how the plan says it: the cores each
rank is bound to, the per-job compiled-graph (recipe) cache, and the execution mode (lazy or eager).

Decisions are pure functions; the rank bootstrap (process/worker.py) applies them on each host, since only
there are that host's cards, NUMA nodes, temporary directory and Gaudi stack known. The planner shows them.
Stdlib only (the worker imports this before the user's script).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
from collections.abc import Mapping, Sequence
from typing import Optional

from gaudi_launch.inputs import cards
from gaudi_launch.inputs.idranges import id_ranges
from gaudi_launch.scriptflags import LAZY_VAR, lazy_mode_setting, script_hpu_flags
from gaudi_launch.wire import CPU_BIND, HOST_CARDS

CPU_BIND_VAR = CPU_BIND  # "none": ranks are not bound (--cpu-bind none)
CPU_BIND_CHOICES = ("numa", "none")
RECIPE_VAR = "PT_HPU_RECIPE_CACHE_CONFIG"
RECIPE_DIR = "recipe-cache"
RECIPE_CACHE_MB = 1024  # the bridge's own default size (Runtime Flags: ",false,1024,false")
# Filesystem types of /proc/self/mountinfo that live on another machine.
NETWORK_FS = frozenset({"nfs", "nfs4", "cifs", "smb3", "smbfs", "lustre", "gpfs", "beegfs", "ceph", "fuse.sshfs"})
# The first release whose "Runtime Flags" page documents the fourth field <RECIPE_CACHE_ON_NFS>. The 1.19
# bridge refuses more than three fields (HabanaAI/gaudi-pytorch-bridge, recipe_cache_config.cpp,
# RecipeCacheConfig::reload: HABANA_ASSERT(params.size() >= 1 && params.size() <= 3)), and no stored page says
# which release first accepted four, so the fourth is written only where it is needed: a network filesystem.
NFS_FIELD_SINCE = (1, 22)
# PT_HPU_LAZY_MODE's default: 1 (lazy) on the 1.19 "Runtime Flags" page, 0 (eager, torch.compile) on the
# current one; 1.21 is the first release that runs eager by default.
EAGER_DEFAULT_SINCE = (1, 21)


def stack_version(version: Optional[str] = None) -> Optional[tuple[int, int]]:
    """(major, minor) of the installed Gaudi PyTorch bridge (habana-torch-plugin, e.g. 1.22.0.740), or None
    when it is not installed or its version does not read. ``version`` given: parse only (pure)."""
    if version is None:
        if _bridge_absent():
            return None  # no habana_frameworks to import: no bridge, and no metadata import to learn it
        version = _bridge_dist_info_version()
    if version is None:
        # imported here: importlib.metadata (and the email package it loads) is a tenth of the rank
        # bootstrap's start-up, which imports this module on every rank, Gaudi or not
        from importlib import metadata

        try:
            version = metadata.version("habana-torch-plugin")
        except metadata.PackageNotFoundError:
            return None
    m = re.match(r"(\d+)\.(\d+)", version or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


_BRIDGE_DIST = "habana_torch_plugin-"  # the bridge's wheel (pip install habana-torch-plugin) names its dist-info so


def _bridge_absent() -> bool:
    """Whether this interpreter cannot import habana_frameworks (the bridge's package): every machine without
    Gaudi, where the launcher then skips importlib.metadata's import (about 15 ms of a dry run)."""
    try:
        return importlib.util.find_spec("habana_frameworks") is None
    except (ImportError, ValueError):
        return False


def _bridge_dist_info_version() -> Optional[str]:
    """The bridge's version from the name of the one habana_torch_plugin-VERSION.dist-info beside the
    habana_frameworks this interpreter would import (a directory listing, as remote/scripts/probe_checks.py reads
    it on every host); None when there is not exactly one, and importlib.metadata then decides. Every Gaudi rank
    asks at its start (the recipe cache), and importlib.metadata's import alone is most of that."""
    try:
        spec = importlib.util.find_spec("habana_frameworks")
    except (ImportError, ValueError):
        return None
    found: set[str] = set()
    for location in (spec.submodule_search_locations or []) if spec is not None else []:
        try:
            names = os.listdir(os.path.dirname(location))
        except OSError:
            continue
        found.update(n for n in names if n.startswith(_BRIDGE_DIST) and n.endswith(".dist-info"))
    return found.pop()[len(_BRIDGE_DIST) : -len(".dist-info")] if len(found) == 1 else None


# ------------------------------------------------------------------ CPU binding


def cpu_bind_env(choice: str) -> dict[str, str]:
    """What --cpu-bind puts in every rank's environment: nothing for the default (the worker binds). Pure."""
    return {CPU_BIND_VAR: "none"} if choice == "none" else {}


def rank_binding(environ: Mapping[str, str], host: cards.HostCards) -> Optional[list[int]]:
    """The cores this rank binds itself to (its card's NUMA node's share), or None: --cpu-bind none, no card
    facts, or no LOCAL_RANK. Pure."""
    if environ.get(CPU_BIND_VAR) == "none" or not host.cards:
        return None
    local, size = environ.get("LOCAL_RANK", ""), environ.get("LOCAL_WORLD_SIZE", "")
    if not local.isdigit() or not size.isdigit() or int(local) >= int(size):
        return None
    modules = cards.rank_modules(int(size), environ.get("HABANA_VISIBLE_MODULES"))
    return cards.rank_cores(modules, host)[int(local)]


# ------------------------------------------------------------------ the hosts' cards, carried to the ranks
# What a rank binds from is hl-smi's `-Q index,module_id,bus_id -f csv,noheader` (cards.QUERY; Habana's hl-smi page,
# -Q, and the module ids of "Multiple Dockers Each with a Single Workload") and the NUMA facts in sysfs. The
# pre-flight's probe (remote/scripts/probe.sh) reads exactly these on every host, so the plan carries them to the
# ranks (HOST_CARDS) and a rank runs hl-smi itself only on a host whose cards did not come with the job (no probe,
# another host's facts, a card missing): on a Gaudi host hl-smi takes about 0.3-1 s, and every rank of a host ran it
# at the same time.

# One environment string must stay under Linux's MAX_ARG_STRLEN (32 pages, 128 KiB) or the ranks' exec fails
# (E2BIG): past this size (about 2,500 hosts with 40-character hostnames) the plan carries nothing and each rank
# reads its cards as before.
CARRY_LIMIT = 100 * 1024


def carry_cards(hosts: Sequence[tuple[Optional[str], Optional[cards.HostCards]]]) -> Optional[str]:
    """HOST_CARDS' value: each host's cards (index, module id, bus id, NUMA node) and the CPUs of those NUMA
    nodes, named by the host's own hostname (its probe's `hostname`: what socket.gethostname() returns there, so a
    rank never takes another host's facts), alike hosts sharing one entry: ``{"layouts": [[cards, cpus,
    [hostname, ...]], ...]}``. ``hosts``: (hostname, cards) per host. A hostname given twice with different cards
    is left out. None when no host has cards. Pure."""
    layouts: list[list] = []
    seen: dict[tuple, int] = {}
    named: dict[str, int] = {}
    clash: set[str] = set()
    for hostname, host in hosts:
        if not hostname or host is None or not host.cards:
            continue
        node = [host.numa_of_bus.get(c.bus_id, -1) for c in host.cards]
        key = (
            tuple((c.index, c.module_id, c.bus_id, n) for c, n in zip(host.cards, node)),
            tuple((n, tuple(host.node_cpus.get(n) or ())) for n in sorted(set(node))),
        )
        which = seen.get(key)
        if which is None:
            which = seen[key] = len(layouts)
            cpus = {str(n): id_ranges(c) for n, c in key[1] if c}
            layouts.append([[list(card) for card in key[0]], cpus, []])
        if named.setdefault(hostname, which) != which:
            clash.add(hostname)
    for hostname, which in named.items():
        if hostname not in clash:
            layouts[which][2].append(hostname)
    kept = [layout for layout in layouts if layout[2]]
    return json.dumps({"layouts": kept}, separators=(",", ":")) if kept else None


def carried_cards(value: str, hostname: str) -> Optional[cards.HostCards]:
    """The cards carry_cards put in ``value`` for ``hostname``, as cards.read_host reads them on that host (without
    who holds them); None when the value has none for it or does not read. Pure."""
    try:
        found = [
            layout for layout in json.loads(value)["layouts"] if isinstance(layout[2], list) and hostname in layout[2]
        ]
        if len(found) != 1:
            return None
        host = cards.HostCards()
        for index, module, bus, node in found[0][0]:
            if not isinstance(bus, str):
                return None
            host.cards.append(cards.Card(index=int(index), module_id=int(module), bus_id=bus))
            host.numa_of_bus[bus] = int(node)
        for node, text in found[0][1].items():
            host.node_cpus[int(node)] = cards.parse_cpulist(str(text))
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        return None
    return host if host.cards else None


def rank_cards(environ: Mapping[str, str], hostname: str) -> Optional[cards.HostCards]:
    """This rank's host's cards as the plan carried them (HOST_CARDS), when they are this host's (``hostname``)
    and hold the card of every local rank; None otherwise: the rank then reads its host itself (hl-smi). Pure."""
    host = carried_cards(environ.get(HOST_CARDS, ""), hostname)
    size = environ.get("LOCAL_WORLD_SIZE", "")
    if host is None or not size.isdigit():
        return host
    wanted = cards.rank_modules(int(size), environ.get("HABANA_VISIBLE_MODULES"))
    return host if set(wanted) <= {c.module_id for c in host.cards} else None


def omp_threads(cores: Sequence[int], siblings: Mapping[int, Sequence[int]]) -> int:
    """OMP_NUM_THREADS for a rank bound to ``cores`` (when the user set none): one thread per physical core
    among them, a core's hyperthread siblings counting once, as PyTorch's CPU launcher sets it to the physical
    cores an instance is bound to (torch.backends.xeon.run_cpu: "OMP_NUM_THREADS | value of
    ncores_per_instance", physical cores unless --use_logical_core). ``siblings``: a CPU's thread siblings
    (sysfs topology/thread_siblings_list); a CPU without them is a core of its own. Pure."""
    return max(1, len({min(siblings.get(c) or [c]) for c in cores}))


def binding_lines(host: str, modules: Sequence[int], facts: cards.HostCards) -> list[str]:
    """How each local rank on ``host`` is bound, one line per rank, for the plan. Pure."""
    node_of = {c.module_id: facts.numa_of_bus.get(c.bus_id, -1) for c in facts.cards}
    lines = []
    for rank, (module, cores) in enumerate(zip(modules, cards.rank_cores(modules, facts))):
        where = f"card module {module}, NUMA node {node_of.get(module, -1)}"
        lines.append(
            f"{host} local rank {rank} ({where}): "
            + (f"cores {id_ranges(cores)}" if cores else "not bound (no NUMA node known for its card)")
        )
    return lines


# ------------------------------------------------------------------ recipe cache


def fs_type(path: str, mountinfo: str) -> Optional[str]:
    """The filesystem type of the mount holding ``path`` (absolute, resolved), from /proc/self/mountinfo's
    text: the longest mount point that contains it. Pure."""
    best, kind = -1, None
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        fields, rest = left.split(), right.split()
        if not sep or len(fields) < 5 or not rest:
            continue
        point = fields[4].replace("\\040", " ")
        inside = path == point or path.startswith(point.rstrip("/") + "/")
        if inside and len(point) > best:
            best, kind = len(point), rest[0]
    return kind


def recipe_cache_setting(
    environ: Mapping[str, str], job_dir: str, on_network_fs: bool, version: Optional[tuple[int, int]]
) -> tuple[Optional[str], str]:
    """(PT_HPU_RECIPE_CACHE_CONFIG for this rank or None to leave it, why). Pure.

    Habana's "Runtime Flags" page: <RECIPE_CACHE_PATH>,<RECIPE_CACHE_DELETE>,<RECIPE_CACHE_SIZE_MB>,
    <RECIPE_CACHE_ON_NFS>; one process compiles a recipe and the others read it from disk. A directory of
    the job's own: the ranks of one job share it, another job never reads a stale one. Not cleared at start
    (false): a restart of the same job reuses what it compiled. Three fields on a local disk (the open 1.19
    bridge asserts at most three); the NFS field only on a network filesystem and where the bridge knows it; an
    older bridge asks for a local disk ("avoid remote drives (such as NFS)"), so none is set there.
    """
    if environ.get(RECIPE_VAR):
        return None, f"{RECIPE_VAR} as you set it"
    path = os.path.join(job_dir, RECIPE_DIR)
    nfs_field = version is not None and version >= NFS_FIELD_SINCE
    if on_network_fs and not nfs_field:
        return None, (
            f"no compiled-graph cache: {job_dir} is on a network filesystem and this Gaudi software "
            f"({'unknown version' if version is None else f'{version[0]}.{version[1]}'}) has no NFS setting; set TMPDIR to a "
            "local disk"
        )
    if on_network_fs:
        return f"{path},false,{RECIPE_CACHE_MB},true", "on a network filesystem: the fourth field <RECIPE_CACHE_ON_NFS>"
    return (
        f"{path},false,{RECIPE_CACHE_MB}",
        "three fields, which every release reads; a fourth only on a network filesystem",
    )


# ------------------------------------------------------------------ execution mode


def execution_mode(
    environ: Mapping[str, str], script_args: Sequence[str], version: Optional[tuple[int, int]]
) -> tuple[str, str]:
    """("lazy" or "eager", why) for ranks running this script: the user's PT_HPU_LAZY_MODE, else the script's
    flags (the worker sets the variable from them, scriptflags.py), else the installed stack's own
    default. Pure."""
    if environ.get(LAZY_VAR):
        return ("eager" if environ[LAZY_VAR] == "0" else "lazy"), f"{LAZY_VAR}={environ[LAZY_VAR]} as you set it"
    flags = script_hpu_flags(list(script_args))
    setting = lazy_mode_setting(flags.use_lazy_mode, flags.torch_compile, environ) if flags else None
    if setting is not None:
        why = "--torch_compile" if flags and flags.torch_compile else f"--use_lazy_mode {setting == '1'}".lower()
        return ("eager" if setting == "0" else "lazy"), f"{why} on the script's command line"
    if version is None:
        return "stack default", (
            "no Gaudi software found here: each host's own default (lazy up to 1.20, eager from 1.21)"
        )
    eager = version >= EAGER_DEFAULT_SINCE
    return ("eager" if eager else "lazy"), f"the default of the installed Gaudi software {version[0]}.{version[1]}"


# ------------------------------------------------------------------ what the plan says


def plan_notes(
    *,
    cpu_bind: str,
    local_binding: Sequence[str],
    recipe: tuple[Optional[str], str],
    mode: tuple[str, str],
) -> list[str]:
    """The dry run's lines about binding, the recipe cache and the execution mode. ``local_binding``: the
    binding_lines of the hosts this machine can see; ``recipe``: recipe_cache_setting for this host. Pure."""
    if cpu_bind == "none":
        notes = ["CPU binding: none (--cpu-bind none)"]
    else:
        notes = [
            "CPU binding: each rank binds itself to its share of its Gaudi card's NUMA node (hl-smi's bus id, "
            "/sys/bus/pci/devices/<bus>/numa_node, /sys/devices/system/node/nodeN/cpulist; Habana's "
            "--map-by socket:PE=<cores per card> rule), with OMP_NUM_THREADS one per physical core bound unless "
            "you set it; --cpu-bind none turns it off"
        ]
        notes += [f"  {line}" for line in local_binding]
    value, why = recipe
    if value is not None:
        notes.append(
            f"compiled-graph cache: each rank sets {RECIPE_VAR} to the job's directory on its host, here "
            f"{value} ({why}; Habana's 'Runtime Flags' page)"
        )
    else:
        notes.append(f"compiled-graph cache: {why}")
    notes.append(f"execution mode: {mode[0]} ({mode[1]})")
    return notes
