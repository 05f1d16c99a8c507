"""Slurm's half of planning a job (the slurm backend runs it: backends/slurm.py).

Inside an allocation (salloc, sbatch: SLURM_JOB_ID set) the allocation is the hostfile: its nodes
come from ``scontrol show hostnames $SLURM_JOB_NODELIST`` and --include/--exclude/--num_nodes select
among them as among a hostfile's hosts. From a login node srun allocates the nodes itself
(--num_nodes, --partition, --time, --account, --slurm-args), so the ranks find the master (the
step's first node) themselves, in the worker; the port is drawn at random either way (inputs/slurm.draw_port).
Pure but for scontrol's name expansion and the env files; the nodes are probed by the backend (its detect), which runs
the probe every host gets (remote/scripts/probe.sh) as one srun task per node, into each node's HostFacts.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Callable, Optional

from gaudi_launch.errors import UserError
from gaudi_launch.exitcodes import ExitCode
from gaudi_launch.inputs import slurm
from gaudi_launch.inputs.backend_options import AUTO, SlurmOptions, capabilities
from gaudi_launch.inputs.hostfile import Host
from gaudi_launch.inputs.hostselect import select
from gaudi_launch.inputs.spec import JobSpec
from gaudi_launch.plan.contract import LAYOUT, worker_argv
from gaudi_launch.plan.hostfacts import HostFacts
from gaudi_launch.plan.launchplan import Command, LaunchPlan, layout
from gaudi_launch.plan.shared import new_plan
from gaudi_launch.wire import GRACE, JOB_ID

LATER = "(allocated by srun)"  # a node's name in a plan made before srun allocated the nodes
FIRST_NODE = "(first node of the step)"  # the master, when srun picks the nodes
# Names the ranks get from srun (the worker maps them) or from us: the launcher's own values of
# these must not leak into the ranks (e.g. a stale MASTER_ADDR in the login node's shell).
CONTRACT = (*LAYOUT, "MASTER_ADDR", "MASTER_PORT")


def wanted(spec: JobSpec, environ: Mapping[str, str]) -> bool:
    """--backend slurm (a scheduler's backend), or auto inside an allocation without a hostfile. Pure."""
    if spec.backend != AUTO:
        return capabilities(spec.backend).scheduler
    return spec.hostfile is None and slurm.in_allocation(environ)


def step_name(plan: LaunchPlan) -> str:
    return f"gaudi-launch-{plan.job_id}"


# ---------------------------------------------------------------- planning (pure, given the facts)


def select_nodes(
    spec: JobSpec, environ: Mapping[str, str], hostnames: Callable[[str, Mapping[str, str]], list[str]]
) -> tuple[list[tuple[str, list[int]]], list[str], bool]:
    """(selected (node, device ids), notes, inside an allocation)."""
    notes: list[str] = []
    if slurm.in_allocation(environ):
        nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST") or ""
        nodes = hostnames(nodelist, environ)
        if not nodes:
            raise UserError("the allocation has no nodes", where="SLURM_JOB_NODELIST")
        alloc = slurm.allocation_tasks(environ, len(nodes))
        if spec.num_devices:
            counts = [spec.num_devices] * len(nodes)
        elif alloc:
            counts = alloc
            notes.append(
                f"ranks per node from the allocation (job {environ['SLURM_JOB_ID']}): " + ",".join(map(str, alloc))
            )
        else:
            counts = [1] * len(nodes)
            notes.append("the allocation gives no tasks per node: 1 rank per node (give --num_devices N)")
        hosts = [Host(name=n, slots=c, line=0) for n, c in zip(nodes, counts)]
        selected = select(hosts, include=spec.include or None, exclude=spec.exclude or None)
        if spec.num_nodes is not None and spec.num_nodes > len(selected):
            raise UserError(
                f"asked for {spec.num_nodes} nodes but the allocation (job {environ['SLURM_JOB_ID']}) "
                f"has only {len(selected)} selected",
                where="--num_nodes",
                hint=f"pass --num_nodes {len(selected)} or fewer, or allocate more nodes (salloc/sbatch -N)",
            )
        selected = selected[: spec.num_nodes]
        notes.append(f"Slurm job {environ['SLURM_JOB_ID']}: nodes {', '.join(nodes)}")
        return selected, notes, True
    # From a login node: srun allocates; --include/--exclude name nodes for --nodelist/--exclude.
    named = node_names(spec.include, "--include")
    node_names(spec.exclude, "--exclude")
    count = spec.num_nodes or (len(named) if named else 1)
    if named and count != len(named):
        raise UserError(
            f"--include names {len(named)} node(s) but --num_nodes is {count}",
            where="--num_nodes",
            hint="leave --num_nodes out, or name as many nodes",
        )
    k = spec.num_devices or 1
    if not spec.num_devices:
        notes.append("1 rank per node: give --num_devices N for N ranks (devices) per node")
    notes.append("srun allocates the nodes; each rank sets MASTER_ADDR to the step's first node")
    return [(named[i] if named else LATER, list(range(k))) for i in range(count)], notes, False


def node_names(selector: Optional[str], option: str) -> list[str]:
    """Node names of a selector; device slots cannot be chosen before srun allocates. Pure."""
    if not selector:
        return []
    names = [part.strip() for part in selector.split("@") if part.strip()]
    if any(":" in n for n in names):
        raise UserError(
            f"{option} picks devices, which is possible only inside an allocation",
            where=option,
            hint="name whole nodes ('node1@node2'), or run gaudi-launch inside salloc/sbatch",
        )
    return names


class NodeCheckFailed(UserError):
    exit_code = ExitCode.PREFLIGHT  # 3, as the pre-flight: nothing was started


def check_nodes(
    facts: Optional[Mapping[str, HostFacts]],
    script: str,
    python: str,
    port: int = 0,
    needed: int = 0,
    error: Optional[str] = None,
) -> None:
    """What would make every rank on a node fail at once, from each node's facts (the probe every host gets,
    through srun): an interpreter that does not run there, a script the node does not have, the master port
    taken on the master node, fewer cards than ranks. Pure."""
    if error and ("No such file" in error or "execve" in error):
        raise NodeCheckFailed(
            f"srun could not start the probe on the nodes: {error}",
            where="--backend slurm",
            hint="check that srun runs on the allocation's nodes (srun -N1 true); nothing was started",
        )
    if not facts:
        return
    no_python = [node for node, f in facts.items() if f.python_ok is False]
    if no_python:
        where = facts[no_python[0]].python_path
        how = f"found at {where} but does not run" if where else "not found or not executable"
        raise NodeCheckFailed(
            f"the ranks' interpreter {python} is {how} on {', '.join(no_python)}",
            where="--python",
            hint="install gaudi-launch's Python at the same path on every node, or give --python; nothing was started",
        )
    missing = [node for node, f in facts.items() if script and (f.script_ok is False or f.cwd_ok is False)]
    if missing:
        raise NodeCheckFailed(
            f"{script} does not exist on {', '.join(missing)} (the ranks start in {facts[missing[0]].cwd} there)",
            where=missing[0],
            hint="put the script on a filesystem every node mounts at the same path; nothing was started",
        )
    busy = [node for node, f in facts.items() if f.port_free is False]
    if busy:
        raise NodeCheckFailed(
            f"the master port {port} is in use on {busy[0]} (another job on the node?)",
            where=busy[0],
            hint="give another --master_port; nothing was started",
        )
    short = [(node, f.devices) for node, f in facts.items() if f.devices is not None and f.devices < needed]
    if short:
        raise NodeCheckFailed(
            f"hl-smi sees {short[0][1]} Gaudi device(s) on {short[0][0]}, {needed} needed",
            where=short[0][0],
            hint="lower --num_devices (or --include fewer), or check the devices with hl-smi; nothing was started",
        )


def without_facts(plan: LaunchPlan, environ: Mapping[str, str], error: Optional[str]) -> None:
    """The notes of a plan whose nodes were not probed (the planner picks the interface from the nodes' facts
    when there are some, as for every backend: multinode.apply_facts). Pure."""
    if error:
        plan.notes.append(f"nodes not probed: srun said {error}")
    if {**environ, **plan.env}.get("HCCL_SOCKET_IFNAME"):
        plan.ifname = {**environ, **plan.env}["HCCL_SOCKET_IFNAME"]
        plan.notes.append(f"interface {plan.ifname}: HCCL_SOCKET_IFNAME as you set it")
    else:
        plan.notes.append("interface: not probed (srun could not run on the nodes): left to defaults")


def draft(
    spec: JobSpec,
    environ: Mapping[str, str],
    hostnames: Callable[[str, Mapping[str, str]], list[str]] = slurm.scontrol_hostnames,
) -> LaunchPlan:
    """A Slurm job's own half of its plan: the nodes (the allocation's, or srun's to pick), the master, the
    job's variables. Pure except ``hostnames`` (scontrol) and reading the env files (as every plan); the
    planner adds what every backend's plan shares (planner.assemble) and the backend's node probe (detect)."""
    if spec.hostfile is not None:
        raise UserError(
            "--backend slurm takes its nodes from Slurm, not from a hostfile",
            where="--hostfile",
            hint="leave --hostfile out (inside salloc/sbatch the allocation is the hostfile)",
        )
    if spec.no_python and spec.module:
        raise UserError("--module and --no_python cannot be used together", where="--module")
    selected, notes, inside = select_nodes(spec, environ, hostnames)
    if spec.options(SlurmOptions).sbatch and inside:
        raise UserError(
            "--sbatch writes a batch script to submit from a login node; this is an allocation already",
            where="--sbatch",
            hint="leave --sbatch out to run the job here",
        )
    nodes = layout(selected)
    if len({len(n.ranks) for n in nodes}) != 1:
        counts = ", ".join(f"{n.host}: {len(n.ranks)}" for n in nodes)
        raise UserError(
            f"srun starts the same number of ranks on every node, but this selection is uneven ({counts})",
            where="--include" if spec.include else "--exclude",
            hint=f"add --num_devices {min(len(n.ranks) for n in nodes)}",
        )
    master_addr = spec.master_addr or (nodes[0].host if inside else FIRST_NODE)
    master_port = spec.master_port or slurm.draw_port()  # never from the job id, which squeue shows to all
    return new_plan("slurm", nodes, master_addr, master_port, spec, environ, notes)


def build_argv(plan: LaunchPlan, spec: JobSpec, *, inside: bool, cpus_per_task: str = "") -> list[str]:
    """srun's whole command line. Pure."""
    if spec.append_local_rank:  # one argv for every rank: it cannot carry each one's number
        raise UserError(
            "--append-local-rank is not available with srun: ranks read LOCAL_RANK", where="--append-local-rank"
        )
    k = len(plan.nodes[0].ranks)
    argv = [
        "srun",
        f"--job-name={step_name(plan)}",
        f"--nodes={len(plan.nodes)}",
        f"--ntasks={plan.world_size}",
        f"--ntasks-per-node={k}",
    ]
    named = [n.host for n in plan.nodes if n.host != LATER]
    if named:
        argv.append("--nodelist=" + ",".join(named))
    if cpus_per_task.isdigit():
        # sbatch/salloc --cpus-per-task: srun no longer inherits it (Slurm 22.05), and each rank would
        # get one CPU: its data loaders and host threads need the share the allocation asked for.
        argv.append(f"--cpus-per-task={cpus_per_task}")
    if not inside and spec.exclude:
        argv.append("--exclude=" + ",".join(node_names(spec.exclude, "--exclude")))
    # A failing rank ends the step at once; --label tags each line with its rank; the values
    # travel in srun's own environment (never on argv). Only the job id (random, no secret) is
    # given on argv, so that srun itself does not carry it: the job-id sweep must not hit srun.
    argv += ["--kill-on-bad-exit=1", "--label", f"--export=ALL,{JOB_ID}={plan.job_id}"]
    slurm_options = spec.options(SlurmOptions)
    if not inside:
        options = (("--partition", slurm_options.partition), ("--time", slurm_options.time))
        for option, value in (*options, ("--account", slurm_options.account)):
            if value:
                argv.append(f"{option}={value}")
    if slurm_options.slurm_args:
        try:
            argv += shlex.split(slurm_options.slurm_args)  # the user's own srun options, as a list: no shell
        except ValueError as exc:
            raise UserError(f"cannot split --slurm-args: {exc}", where="--slurm-args") from None
    return argv + worker_argv(spec)


def commands(plan: LaunchPlan, environ: Mapping[str, str]) -> list[Command]:
    spec = plan.job
    inside = slurm.in_allocation(environ)
    env = {slurm.RANKS_FROM: "slurm", GRACE: str(spec.grace)}
    if plan.master_addr != FIRST_NODE:
        env["MASTER_ADDR"] = plan.master_addr
    if plan.master_port:
        env["MASTER_PORT"] = str(plan.master_port)
    host = plan.nodes[0].host if inside else "localhost"
    cpus = environ.get("SLURM_CPUS_PER_TASK", "") if inside else ""
    return [Command(host=host, argv=build_argv(plan, spec, inside=inside, cpus_per_task=cpus), env=env)]
