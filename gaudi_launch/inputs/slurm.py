"""Slurm's facts: the allocation's nodes and tasks, and a rank's layout from srun's variables.

Stdlib only and pure except ``scontrol_hostnames``: the rank bootstrap (gaudi_launch.process.worker) imports
this before the user's script, and ``--dry-run`` must work where no Slurm is installed.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
import zlib
from collections.abc import Mapping
from typing import Optional

from gaudi_launch import wire
from gaudi_launch.errors import UserError

# Set by the slurm backend on srun's environment: the ranks' layout comes from srun's variables,
# whatever RANK/LOCAL_RANK/... the launcher's own environment may carry.
RANKS_FROM = wire.RANKS_FROM
PORT_BASE, PORT_SPAN = 20000, 20000


def in_allocation(environ: Mapping[str, str]) -> bool:
    """Inside salloc or an sbatch script, not inside a step (where SLURM_STEP_ID is set)."""
    return bool(environ.get("SLURM_JOB_ID")) and not environ.get("SLURM_STEP_ID")


def expand_hostlist(text: str) -> list[str]:
    """Slurm's compressed host list, 'gls-n[0-2,5],login[01-02]' -> names, in order. Pure.

    Only for what this module reads back from Slurm's own variables (and dry runs without Slurm):
    plans use ``scontrol show hostnames`` when it is there."""
    names: list[str] = []
    for item in _split_top(text.strip()):
        parts = [[""]]  # the cross product of the item's literal and bracketed pieces
        for literal, ranges in re.findall(r"([^\[\]]*)(?:\[([^\]]*)\])?", item):
            if not literal and not ranges:
                continue
            choices = [literal]
            if ranges:
                choices = [literal + n for n in _expand_ranges(ranges, item)]
            parts.append(choices)
        expanded = [""]
        for choices in parts[1:]:
            expanded = [a + b for a in expanded for b in choices]
        names.extend(n for n in expanded if n)
    return names


def _split_top(text: str) -> list[str]:
    items, depth, cur = [], 0, ""
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            items.append(cur)
            cur = ""
        else:
            cur += ch
    if depth != 0:
        raise UserError(f"unbalanced brackets in the Slurm host list {text!r}", where="SLURM_JOB_NODELIST")
    return [i for i in items + [cur] if i]


def _expand_ranges(ranges: str, item: str) -> list[str]:
    out = []
    for part in ranges.split(","):
        lo, _, hi = part.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            raise UserError(f"cannot read {item!r} as a Slurm host list", where="SLURM_JOB_NODELIST")
        width = len(lo)  # zero padding: login[01-02]
        out += [str(i).zfill(width) for i in range(int(lo), int(hi or lo) + 1)]
    return out


def parse_tasks_per_node(text: str) -> list[int]:
    """SLURM_TASKS_PER_NODE, '2(x3),1' -> [2, 2, 2, 1]. Pure."""
    counts: list[int] = []
    for part in filter(None, text.split(",")):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not m:
            raise UserError(f"cannot read tasks per node {text!r}", where="SLURM_TASKS_PER_NODE")
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    return counts


def draw_port() -> int:
    """The job's rendezvous port, drawn at random in the span. Not derived from the Slurm job id: squeue shows
    that to every user, who could take a port that follows from it first. The launcher's draw reaches the ranks
    in srun's environment, which no other user can read; the node probe and rank 0 check it is free."""
    import secrets  # here: the rank bootstrap imports this module, and secrets loads OpenSSL and random

    return PORT_BASE + secrets.randbelow(PORT_SPAN)


def port_for_job(job_id: str) -> int:
    """A rendezvous port derived from the Slurm job id: only for ranks srun started without gaudi-launch's
    MASTER_PORT (the worker's fallback), and the collective check's own port. Pure."""
    n = int(job_id) if job_id.isdigit() else zlib.crc32(job_id.encode())
    return PORT_BASE + n % PORT_SPAN


def has_config(environ: Mapping[str, str]) -> bool:
    """Without one, every Slurm command looks the controller up in DNS (configless Slurm)."""
    return bool(environ.get("SLURM_CONF")) or os.path.exists("/etc/slurm/slurm.conf")


def scontrol_hostnames(nodelist: str, environ: Optional[Mapping[str, str]] = None) -> list[str]:
    """``scontrol show hostnames`` (Slurm's own expansion); the pure parser where Slurm is absent.

    Not without a configuration: scontrol would look the controller up in DNS (configless Slurm),
    a query off the machine, for an expansion that needs none."""
    environ = os.environ if environ is None else environ
    scontrol = shutil.which("scontrol", path=environ.get("PATH"))
    if scontrol is None or not has_config(environ):
        return expand_hostlist(nodelist)
    try:
        out = subprocess.run(
            [scontrol, "show", "hostnames", nodelist],
            capture_output=True,
            text=True,
            timeout=30,
            stdin=subprocess.DEVNULL,
            env=dict(environ),
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise UserError(f"scontrol show hostnames failed: {exc}", where="SLURM_JOB_NODELIST") from None
    if out.returncode != 0:
        raise UserError(
            f"scontrol show hostnames {nodelist!r} failed: {out.stderr.strip()}",
            where="SLURM_JOB_NODELIST",
            hint="is SLURM_CONF set for this cluster?",
        )
    return out.stdout.split()


def allocation_tasks(environ: Mapping[str, str], nodes: int) -> Optional[list[int]]:
    """Tasks per node the allocation was given (salloc/sbatch --ntasks-per-node, -n), or None. Pure."""
    if environ.get("SLURM_NTASKS_PER_NODE", "").isdigit():
        return [int(environ["SLURM_NTASKS_PER_NODE"])] * nodes
    if environ.get("SLURM_TASKS_PER_NODE"):
        counts = parse_tasks_per_node(environ["SLURM_TASKS_PER_NODE"])
        if len(counts) == nodes:
            return counts
    return None


# ---------------------------------------------------------------- the rank's side (worker)


def _first(env: Mapping[str, str], *names: str) -> Optional[str]:
    return next((env[n] for n in names if env.get(n, "") != ""), None)


def rank_layout(env: Mapping[str, str]) -> dict[str, str]:
    """torchrun's names from srun's task variables, for a rank srun started. Pure.

    MASTER_ADDR/MASTER_PORT only when the launcher did not give them: the step's first node (srun allocated
    the nodes) and, for a worker srun started without gaudi-launch's port, one derived from the job id."""
    out: dict[str, str] = {}
    pairs = (
        ("RANK", ("SLURM_PROCID",)),
        ("WORLD_SIZE", ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS")),
        ("LOCAL_RANK", ("SLURM_LOCALID",)),
        ("NODE_RANK", ("SLURM_NODEID",)),
        ("CROSS_SIZE", ("SLURM_STEP_NUM_NODES", "SLURM_NNODES")),
    )
    for name, sources in pairs:
        value = _first(env, *sources)
        if value is not None:
            out[name] = value
    per_node = _first(env, "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")
    if per_node and out.get("NODE_RANK", "").isdigit():
        try:
            counts = parse_tasks_per_node(per_node)
        except UserError:
            counts = []
        if int(out["NODE_RANK"]) < len(counts):
            out["LOCAL_WORLD_SIZE"] = str(counts[int(out["NODE_RANK"])])
    if not env.get("MASTER_ADDR"):
        nodelist = _first(env, "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
        try:
            first = expand_hostlist(nodelist)[:1] if nodelist else []
        except UserError:
            first = []
        if first:
            out["MASTER_ADDR"] = first[0]
    if not env.get("MASTER_PORT") and env.get("SLURM_JOB_ID"):
        out["MASTER_PORT"] = str(port_for_job(env["SLURM_JOB_ID"]))
    return out


def _group_of(pid: str) -> Optional[int]:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] in ("Z", "X") else int(fields[2])


def wait_alone_in_group(timeout: float = 30.0) -> bool:
    """srun puts all tasks of a node in the process group of the first one; each worker moves to a
    group of its own at start. The first task leads the shared group and signals its whole group when
    it ends (to take its own children along): it waits until its sibling tasks have left, so that a
    quick first rank never kills a sibling that is still starting. True once alone."""
    me, group = os.getpid(), os.getpgrp()
    if group != me:
        return True
    deadline = time.monotonic() + timeout
    while True:
        if not any(int(p) != me and _group_of(p) == group for p in os.listdir("/proc") if p.isdigit()):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
