"""Backend ``slurm``: one ``srun`` starts every rank through gaudi_launch.process.worker.

Inside an allocation (salloc, sbatch: SLURM_JOB_ID set) the allocation is the hostfile: its nodes
come from ``scontrol show hostnames $SLURM_JOB_NODELIST`` and --include/--exclude/--num_nodes select
among them as among a hostfile's hosts. From a login node srun allocates the nodes itself
(--num_nodes, --partition, --time, --account, --slurm-args), so the ranks find the master (the
step's first node) and the port (derived from the job id) themselves, in the worker.

Values never reach a command line or a shell: srun gets ``--export=ALL`` and carries its own
environment, which holds the job's values, to the ranks. Teardown: srun's SIGTERM kills the step
with SIGKILL at once and SIGINT needs repeating within a second, so the step is signalled with
``scancel --signal=TERM JOB.STEP`` (the grace period holds), then SIGKILLed like every backend.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
from collections.abc import Collection, Mapping
from typing import Any, Callable, Optional

from gaudi_launch.errors import UserError
from gaudi_launch.inputs import slurm
from gaudi_launch.inputs.envfile import load_env_files, secrets_in
from gaudi_launch.inputs.hostfile import Host
from gaudi_launch.inputs.hostselect import select
from gaudi_launch.inputs.spec import JobSpec
from gaudi_launch.plan import fabric
from gaudi_launch.plan.contract import node_device_env, worker_argv
from gaudi_launch.plan.launchplan import Command, LaunchPlan, layout
from gaudi_launch.process.failures import Culprit
from gaudi_launch.process.supervise import Hooks, JobResult, ProcSpec, supervise_job
from gaudi_launch.remote.teardown import kill_argv, parse_sweep
from gaudi_launch.remote.watch import HostWatch

LATER = "(allocated by srun)"  # a node's name in a plan made before srun allocated the nodes
FIRST_NODE = "(first node of the step)"  # the master, when srun picks the nodes
# Names the ranks get from srun (the worker maps them) or from us: the launcher's own values of
# these must not leak into the ranks (e.g. a stale MASTER_ADDR in the login node's shell).
CONTRACT = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "LOCAL_SIZE",
    "NODE_RANK",
    "GROUP_RANK",
    "CROSS_RANK",
    "CROSS_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
)


def wanted(spec: JobSpec, environ: Mapping[str, str]) -> bool:
    """--backend slurm, or auto inside an allocation without a hostfile. Pure."""
    return spec.backend == "slurm" or (
        spec.backend == "auto" and spec.hostfile is None and slurm.in_allocation(environ)
    )


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
    named = _node_names(spec.include, "--include")
    _node_names(spec.exclude, "--exclude")
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
    notes.append(
        "srun allocates the nodes; each rank sets MASTER_ADDR to the step's first node and "
        "MASTER_PORT from the Slurm job id"
    )
    return [(named[i] if named else LATER, list(range(k))) for i in range(count)], notes, False


def _node_names(selector: Optional[str], option: str) -> list[str]:
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


# Run once per node through srun (no ssh on Slurm clusters): the node's addresses, and the master's
# address as the node resolves it (a login node may not know the compute nodes' names).
PROBE = r"""
import json, os, socket, subprocess, sys
try:
    ip = subprocess.run(["ip", "-o", "addr", "show"], capture_output=True, text=True, timeout=10).stdout
except Exception:
    ip = ""
try:
    master = socket.getaddrinfo(sys.argv[1], None, type=socket.SOCK_STREAM)[0][4][0]
except Exception:
    master = None
script = sys.argv[2] if len(sys.argv) > 2 else ""
port_free = None
if len(sys.argv) > 3 and int(sys.argv[3]) and socket.gethostname() == sys.argv[1]:  # the master only
    try:
        with socket.socket() as s:
            s.bind(("", int(sys.argv[3])))
        port_free = True
    except OSError:
        port_free = False
devices = None  # Gaudi devices hl-smi sees; None where there is no hl-smi (not checked)
try:
    smi = subprocess.run(["hl-smi", "-Q", "module_id", "-f", "csv,noheader"], capture_output=True, text=True,
                         timeout=20)
    devices = len([l for l in smi.stdout.splitlines() if l.strip()]) if smi.returncode == 0 else 0
except FileNotFoundError:
    pass
except Exception:
    devices = 0
print(json.dumps({"ip_addr": ip, "master_ip": master, "script": os.path.isfile(script) if script else None,
                  "cwd": os.getcwd(), "port_free": port_free, "devices": devices}))
"""


class NodeCheckFailed(UserError):
    exit_code = 3  # as the pre-flight: nothing was started


def probe_argv(nodes: list[str], job: str, master: str, python: str, script: str = "", port: int = 0) -> list[str]:
    """One task per node beside any running step (--overlap). Pure."""
    return [
        "srun",
        "--overlap",
        f"--jobid={job}",
        f"--nodes={len(nodes)}",
        f"--ntasks={len(nodes)}",
        "--ntasks-per-node=1",
        "--nodelist=" + ",".join(nodes),
        "--label",
        "--export=ALL",
        python,
        "-c",
        PROBE,
        master,
        script,
        str(port),
    ]


# {node: what the probe saw there (a JSON object)}, or {"error": srun's words} when it could not probe.
NodeFacts = dict[str, Any]


def probe_nodes(
    nodes: list[str], master: str, python: str, environ: Mapping[str, str], script: str = "", port: int = 0
) -> Optional[NodeFacts]:
    """{node: {"ip_addr", "master_ip", "script", "cwd"}} from the allocation's nodes; None when
    srun cannot tell ({"error": srun's words} when it said why)."""
    import json
    import shutil

    if shutil.which("srun", path=environ.get("PATH")) is None or not slurm.has_config(environ):
        return None
    env = {k: v for k, v in environ.items() if k not in CONTRACT and k != "GAUDI_LAUNCH_JOB_ID"}
    try:
        out = subprocess.run(
            probe_argv(nodes, environ.get("SLURM_JOB_ID", ""), master, python, script, port),
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    facts: dict[str, dict] = {}
    for rank, line in (srun_demux()(t)[0] for t in out.stdout.splitlines()):
        if rank is not None and rank < len(nodes):
            try:
                facts[nodes[rank]] = json.loads(line)
            except ValueError:
                pass
    if len(facts) == len(nodes):
        return {node: facts[node] for node in nodes}  # the plan's order, not srun's output's
    words = [line for line in out.stderr.splitlines() if "error" in line.lower()][:3]
    return {"error": "; ".join(words)} if words else None


def check_nodes(facts: Optional[NodeFacts], script: str, python: str, port: int = 0, needed: int = 0) -> None:
    """What would make every rank on a node fail at once: a script the node does not have, or an
    interpreter srun could not start there. Pure."""
    if not facts:
        return
    if "error" in facts and ("No such file" in facts["error"] or "execve" in facts["error"]):
        raise NodeCheckFailed(
            f"srun could not start the ranks' interpreter {python} on the nodes: {facts['error']}",
            where="--python",
            hint="install gaudi-launch's Python at the same path on every node, or give --python; nothing was started",
        )
    missing = [node for node, f in facts.items() if node != "error" and f.get("script") is False]
    if missing:
        raise NodeCheckFailed(
            f"{script} does not exist on {', '.join(missing)} (the ranks start in "
            f"{facts[missing[0]].get('cwd')} there)",
            where=missing[0],
            hint="put the script on a filesystem every node mounts at the same path; nothing was started",
        )
    busy = [node for node, f in facts.items() if node != "error" and f.get("port_free") is False]
    if busy:
        raise NodeCheckFailed(
            f"the master port {port} is in use on {busy[0]} (another job on the node?)",
            where=busy[0],
            hint="give another --master_port; nothing was started",
        )
    short = [
        (node, f["devices"])
        for node, f in facts.items()
        if node != "error" and isinstance(f.get("devices"), int) and f["devices"] < needed
    ]
    if short:
        raise NodeCheckFailed(
            f"hl-smi sees {short[0][1]} Gaudi device(s) on {short[0][0]}, {needed} needed",
            where=short[0][0],
            hint="lower --num_devices (or --include fewer), or check the devices with hl-smi; nothing was started",
        )


def apply_node_facts(plan: LaunchPlan, facts: Optional[NodeFacts], environ: Mapping[str, str]) -> None:
    """The interface for HCCL/GLOO/NCCL_SOCKET_IFNAME, as for mpirun: the one carrying the master's
    subnet on every node. Pure."""
    if facts and "error" in facts:
        plan.notes.append(f"nodes not probed: srun said {facts['error']}")
        facts = None
    if {**environ, **plan.env}.get("HCCL_SOCKET_IFNAME"):
        plan.ifname = {**environ, **plan.env}["HCCL_SOCKET_IFNAME"]
        plan.notes.append(f"interface {plan.ifname}: HCCL_SOCKET_IFNAME as you set it")
        return
    if not facts:
        plan.notes.append("interface: not probed (srun could not run on the nodes): left to defaults")
        return
    master_ip = facts.get(plan.nodes[0].host, {}).get("master_ip")
    interfaces = {h: fabric.parse_ip_addr(f.get("ip_addr") or "") for h, f in facts.items()}
    if not master_ip:
        plan.notes.append(f"interface: {plan.master_addr} does not resolve on {plan.nodes[0].host}: left to defaults")
        return
    plan.ifname, how = fabric.choose_interface(master_ip, interfaces)
    plan.notes.append(
        f"interface {plan.ifname}: "
        + (
            f"carries the master's subnet ({master_ip}) on every node"
            if how == "subnet"
            else "no node has an address on the master's subnet: first common interface (fallback)"
        )
    )


def build_plan(
    spec: JobSpec,
    environ: Mapping[str, str],
    hostnames: Callable[[str, Mapping[str, str]], list[str]] = slurm.scontrol_hostnames,
    probe: Callable[..., Optional[NodeFacts]] = probe_nodes,
) -> LaunchPlan:
    """The plan of a Slurm job. Pure except ``hostnames``, ``probe`` (inside an allocation, unless
    --no-ssh-check) and reading the env files (as every plan)."""
    if spec.hostfile is not None:
        raise UserError(
            "--backend slurm takes its nodes from Slurm, not from a hostfile",
            where="--hostfile",
            hint="leave --hostfile out (inside salloc/sbatch the allocation is the hostfile)",
        )
    if spec.no_python and spec.module:
        raise UserError("--module and --no_python cannot be used together", where="--module")
    selected, notes, inside = select_nodes(spec, environ, hostnames)
    if spec.sbatch and inside:
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
    job_id = environ.get("SLURM_JOB_ID", "")
    master_addr = spec.master_addr or (nodes[0].host if inside else FIRST_NODE)
    master_port = spec.master_port or (slurm.port_for_job(job_id) if inside else 0)
    env, sources = load_env_files(explicit=spec.env_file, environ=environ)
    env.update(spec.env)
    if sources:
        notes.append("environment files read: " + ", ".join(sources))
    import secrets

    plan = LaunchPlan(
        backend="slurm",
        world_size=sum(len(n.ranks) for n in nodes),
        master_addr=master_addr,
        master_port=master_port,
        nodes=nodes,
        env=env,
        commands=[],
        program=list(spec.program),
        notes=notes,
        job_id=secrets.token_hex(4),
    )
    # srun --export=ALL: the ranks get the launcher's whole environment, so every secret-looking
    # variable of it is masked in output, named by the exported prefixes or not.
    plan.exported = [n for n in fabric.exported_names(environ, spec.export_prefixes) if n not in plan.env]
    plan.exported_secrets = secrets_in(environ)
    if inside and spec.ssh_check:
        script = spec.program[0] if spec.program and not spec.module and not spec.no_python else ""
        facts = probe([n.host for n in nodes], master_addr, spec.python, environ, script=script, port=master_port)
        check_nodes(facts, script, spec.python, master_port, needed=max(len(n.devices) for n in nodes))
        apply_node_facts(plan, facts, environ)
    efa = spec.efa if spec.efa is not None else fabric.efa_present()
    plan.env.update(
        fabric.fabric_env({**environ, **plan.env}, efa=efa, ifname=plan.ifname, wrapper_dir=spec.hccl_ofi_wrapper)
    )
    if any(n.devices != list(range(len(n.devices))) for n in nodes):
        plan.env.update(node_device_env([n.devices for n in nodes], [dict(environ)] * len(nodes)))
    plan.spec = spec
    plan.commands = commands(plan, environ)
    plan.request = spec.as_request(os.getcwd())
    return plan


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
        argv.append("--exclude=" + ",".join(_node_names(spec.exclude, "--exclude")))
    # A failing rank ends the step at once; --label tags each line with its rank; the values
    # travel in srun's own environment (never on argv). Only the job id (random, no secret) is
    # given on argv, so that srun itself does not carry it: the job-id sweep must not hit srun.
    argv += ["--kill-on-bad-exit=1", "--label", f"--export=ALL,GAUDI_LAUNCH_JOB_ID={plan.job_id}"]
    if not inside:
        for option, value in (("--partition", spec.partition), ("--time", spec.time), ("--account", spec.account)):
            if value:
                argv.append(f"{option}={value}")
    if spec.slurm_args:
        try:
            argv += shlex.split(spec.slurm_args)  # the user's own srun options, as a list: no shell
        except ValueError as exc:
            raise UserError(f"cannot split --slurm-args: {exc}", where="--slurm-args") from None
    return argv + worker_argv(spec)


def detect(plan: LaunchPlan, environ: Mapping[str, str]) -> None:
    """Nothing more to look at: build_plan reads the allocation and probes its nodes."""


def commands(plan: LaunchPlan, environ: Mapping[str, str]) -> list[Command]:
    spec = plan.job
    inside = slurm.in_allocation(environ)
    env = {slurm.RANKS_FROM: "slurm", "GAUDI_LAUNCH_GRACE": str(spec.grace)}
    if plan.master_addr != FIRST_NODE:
        env["MASTER_ADDR"] = plan.master_addr
    if plan.master_port:
        env["MASTER_PORT"] = str(plan.master_port)
    host = plan.nodes[0].host if inside else "localhost"
    cpus = environ.get("SLURM_CPUS_PER_TASK", "") if inside else ""
    return [Command(host=host, argv=build_argv(plan, spec, inside=inside, cpus_per_task=cpus), env=env)]


def srun_env(plan: LaunchPlan, environ: Mapping[str, str]) -> dict[str, str]:
    """srun's whole environment: the launcher's without its own rank layout, the job's, ours. Pure."""
    base = {k: v for k, v in environ.items() if k not in CONTRACT and k != "GAUDI_LAUNCH_JOB_ID"}
    return {**base, **plan.env, **plan.commands[0].env}


def sweep_argv(plan: LaunchPlan, spec: JobSpec, job: str, nodes: list[str], sig: int, since: float) -> list[str]:
    """One task per node of the job, beside its step (--overlap), signalling the processes that
    carry the job's id there: what left the step's process tracking (a rank's setsid daemon). Pure."""
    return [
        "srun",
        "--overlap",
        f"--jobid={job}",
        f"--job-name={step_name(plan)}-sweep",
        f"--nodes={len(nodes)}",
        f"--ntasks={len(nodes)}",
        "--ntasks-per-node=1",
        "--nodelist=" + ",".join(nodes),
        "--label",
        "--export=ALL",
        *kill_argv(spec.python, plan.job_id, sig, since),
    ]


def parse_sweep_output(text: str, nodes: list[str]) -> dict[str, object]:
    """srun --label's output of the sweep, per node (task i runs on the i-th node). Pure."""
    per_task: dict[int, list[str]] = {}
    for rank, line in map(lambda t: srun_demux()(t)[0], text.splitlines()):
        if rank is not None:
            per_task.setdefault(rank, []).append(line)
    return {node: parse_sweep("\n".join(per_task.get(i, []))) for i, node in enumerate(nodes)}


class Where:
    """The job's Slurm job id and nodes: known from the start inside an allocation; from a login node
    once srun has the allocation (its step, found by name). Then ranks map to their nodes too."""

    def __init__(self, plan: LaunchPlan, env: Mapping[str, str], inside: bool, ranks: dict[int, str]):
        import threading

        self.plan, self.env, self.ranks = plan, env, ranks
        self.job: Optional[str] = env.get("SLURM_JOB_ID") if inside else None
        self.nodes: Optional[list[str]] = [n.host for n in plan.nodes] if inside else None
        self.lock = threading.Lock()

    def known(self) -> Optional[list[str]]:
        """The job's nodes, once Slurm tells them (None until then)."""
        with self.lock:
            if self.nodes is None:
                listed = _slurm_cmd(["squeue", "--me", "-h", "-s", "-o", "%i %j %N"], self.env) or ""
                for line in listed.splitlines():
                    parts = line.split()
                    if len(parts) == 3 and parts[1] == step_name(self.plan):
                        nodes = slurm.scontrol_hostnames(parts[2], self.env)
                        if len(nodes) == len(self.plan.nodes):
                            self.job, self.nodes = parts[0].split(".")[0], nodes
                            for node, planned in zip(nodes, self.plan.nodes):
                                self.ranks.update({r: node for r in planned.ranks})
            return self.nodes


def sweeper(
    plan: LaunchPlan,
    spec: JobSpec,
    environ: Mapping[str, str],
    where: Where,
    lost: Callable[[], Collection[str]] = frozenset,
):
    """The job-id sweep on the job's nodes that still answer (once they are known)."""
    import time

    env = srun_env(plan, environ)
    since = time.time() - 60

    def sweep(sig: int):
        nodes = where.known()  # (sets where.job with the nodes)
        job = where.job
        if nodes is None or job is None:
            return {}
        alive = [n for n in nodes if n not in lost()]
        if not alive:
            return {}
        try:
            out = subprocess.run(
                sweep_argv(plan, spec, job, alive, sig, since),
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
                stdin=subprocess.DEVNULL,
            )
        except (OSError, subprocess.SubprocessError):
            return {}
        return parse_sweep_output(out.stdout, alive)

    return sweep


def parse_node_addrs(text: str) -> dict[str, str]:
    """`scontrol -o show node` -> {NodeName: NodeAddr}. Pure."""
    out = {}
    for line in text.splitlines():
        fields = dict(w.split("=", 1) for w in line.split() if "=" in w)
        if fields.get("NodeName"):
            out[fields["NodeName"]] = fields.get("NodeAddr") or fields["NodeName"]
    return out


def parse_slurmd_port(text: str) -> int:
    """SlurmdPort from `scontrol show config` (6818 unless set). Pure."""
    m = re.search(r"^SlurmdPort\s*=\s*(\d+)", text, re.M)
    return int(m.group(1)) if m else 6818


def node_watch(nodes: list[str], environ: Mapping[str, str]):
    """A watch over the job's nodes, as over ssh hosts elsewhere: each node's slurmd port (srun
    itself reaches it there). None when Slurm cannot say where the nodes are."""
    shown = _slurm_cmd(["scontrol", "-o", "show", "node", ",".join(nodes)], environ)
    config = _slurm_cmd(["scontrol", "show", "config"], environ)
    if not shown or not config:
        return None
    addrs, port = parse_node_addrs(shown), parse_slurmd_port(config)
    return HostWatch([(n, addrs.get(n, n), port) for n in nodes])


# ---------------------------------------------------------------- srun's output

_LABEL = re.compile(r"^ *(\d+): ")
# srun's report of a task: "srun: error: gls-n1: task 3: Exited with exit code 7",
# "srun: error: gls-n0: tasks 0-1: Terminated"
_TASK = re.compile(r"^srun: error: (\S+): tasks? ([\d,-]+): (.*)$")


def srun_demux():
    """--label prefixes each line of a rank with 'N: ' (padded to the widest rank)."""

    def demux(line: Optional[str]):
        if line is None:
            return []
        m = _LABEL.match(line)
        if m:
            return [(int(m.group(1)), line[m.end() :])]
        return [(None, line)]

    return demux


def _first_task(ids: str) -> int:
    return int(re.split(r"[,-]", ids)[0])


def task_failed(line: str) -> bool:
    """srun's word that a task ended badly (it then ends the step: --kill-on-bad-exit)."""
    return bool(_TASK.match(line))


def explain(lines: list[str]):
    """The first task srun reported as failed, with its own exit code (srun itself returns 143)."""
    for line in lines:
        m = _TASK.match(line)
        if not m:
            continue
        what = m.group(3).strip()
        code = re.fullmatch(r"Exited with exit code (\d+)", what)
        if code and code.group(1) == "0":
            continue
        status = f"exit code {code.group(1)}" if code else what
        culprit = Culprit(_first_task(m.group(2)), m.group(1), status, [])
        if code:
            culprit.exit_code = int(code.group(1))
        return culprit
    # No task failed: srun itself did (no step, no allocation); no rank is to blame.
    for line in lines:
        if line.startswith("srun: error: "):
            status = "srun failed: " + line[len("srun: error: ") :]
            if "More processors requested than permitted" in line:
                status += (
                    " (more ranks per node than the allocation has CPUs for: allocate more, or add "
                    "--slurm-args=--overcommit)"
                )
            return Culprit(None, "this host", status, [line])
    return None


# ---------------------------------------------------------------- running


def _slurm_cmd(argv: list[str], env: Mapping[str, str], timeout: float = 20.0) -> Optional[str]:
    try:
        out = subprocess.run(
            argv, env=dict(env), capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def stopper(name: str, env: Mapping[str, str]) -> Callable[[int], None]:
    """Signal the job's step by name: SIGTERM reaches the ranks and the grace period holds.

    In the background: scancel waits for nodes that may not answer (a lost node), and the grace
    period and the SIGKILL of srun must not wait for it."""
    import threading

    def stop(sig: int) -> None:
        threading.Thread(target=signal_step, args=(sig,), daemon=True).start()

    def signal_step(sig: int) -> None:
        # (squeue --name does not filter steps: every step of the user's would match)
        listed = _slurm_cmd(["squeue", "--me", "-h", "-s", "-o", "%i %j"], env) or ""
        steps = [line.split()[0] for line in listed.splitlines() if line.split()[1:] == [name]]
        if steps:
            what = "KILL" if sig == signal.SIGKILL else "TERM"
            _slurm_cmd(["scancel", f"--signal={what}", *steps], env)
        else:
            # Not started yet: a job srun is still waiting for (from a login node) is cancelled.
            _slurm_cmd(["scancel", "--me", f"--name={name}"], env)

    return stop


def run(plan: LaunchPlan, environ: Optional[Mapping[str, str]] = None, **supervisor_options) -> JobResult:
    import shutil

    spec = plan.job
    environ = os.environ if environ is None else environ
    env = srun_env(plan, environ)
    if shutil.which("srun", path=env.get("PATH")) is None:
        raise UserError(
            "srun is not installed on this host",
            where="--backend slurm",
            hint="run gaudi-launch where Slurm's client commands are (a login node or inside "
            "an allocation), or use --hostfile with --backend mpirun",
        )
    cmd = plan.commands[0]
    ranks = {r: ("" if n.host == LATER else n.host) for n in plan.nodes for r in n.ranks}
    proc = ProcSpec(
        rank=0,
        host=cmd.host,
        argv=cmd.argv,
        env=env,
        label="srun",
        ranks=ranks,
    )
    where = Where(plan, env, slurm.in_allocation(environ), ranks)
    watches: list = []  # the node watch, made once the nodes are known (None: Slurm cannot tell)

    def probe() -> Optional[str]:
        if not watches:
            nodes = where.known()
            if nodes is None:
                return None
            watches.append(node_watch(nodes, env))
        if watches[0] is None:
            return None
        message = watches[0].probe()
        return message.replace("or sshd gone", "or its slurmd gone") if message else None

    sweep = sweeper(plan, spec, environ, where, lost=lambda: watches[0].lost if watches and watches[0] else ())
    hooks = Hooks(
        demux=srun_demux,
        explain=explain,
        stop=stopper(step_name(plan), env),
        alarm=task_failed,
        watch=probe,
        sweep=sweep,
    )
    return supervise_job(plan, [proc], hooks, **supervisor_options)
