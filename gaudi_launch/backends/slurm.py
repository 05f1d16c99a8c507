"""Backend ``slurm``: one ``srun`` starts every rank through gaudi_launch.process.worker.

The plan (which nodes, srun's command line) is plan/slurm.py's; here are the node probe the planner
asks for (``detect``) and the run.

Values never reach a command line or a shell: srun gets ``--export=ALL`` and carries its own
environment, which holds the job's values, to the ranks. Teardown: srun's SIGTERM kills the step
with SIGKILL at once and SIGINT needs repeating within a second, so the step is signalled with
``scancel --signal=TERM JOB.STEP`` (the grace period holds), then SIGKILLed like every backend.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from collections.abc import Collection, Mapping
from typing import Callable, Optional

from gaudi_launch.errors import UserError
from gaudi_launch.inputs import slurm
from gaudi_launch.inputs.spec import JobSpec
from gaudi_launch.plan.hostfacts import HostFacts
from gaudi_launch.plan.launchplan import LaunchPlan
from gaudi_launch.plan.slurm import (  # noqa: F401  (commands: this backend's, planned in plan/)
    CONTRACT,
    LATER,
    check_nodes,
    commands,
    step_name,
    without_facts,
)
from gaudi_launch.process.failures import Culprit
from gaudi_launch.process.supervise import Hooks, JobResult, ProcSpec, supervise_job
from gaudi_launch.remote import probe
from gaudi_launch.remote.teardown import kill_argv, parse_sweep
from gaudi_launch.remote.watch import HostWatch
from gaudi_launch.wire import JOB_ID

PROBE_TIMEOUT = 90.0  # seconds: the probe's tools have 20 s each (probe.sh), srun's start on busy nodes on top


def probe_argv(
    nodes: list[str], job: str, master: str, python: str, script: str = "", port: int = 0, cwd: str = ""
) -> list[str]:
    """One task per node beside any running step (--overlap), each running the probe every host gets
    (remote/probe.py: one ``sh -c`` line, every value shlex-quoted): the master is only resolved there (no sshd
    to reach, port 0), and ``port`` is tried on every node (only the master node's answer counts). Pure."""
    line = probe.command(python, script or None, cwd or os.getcwd(), master, 0, port or None)
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
        "sh",
        "-c",
        line,
    ]


def read_probe_output(
    text: str, nodes: list[str], master: str, script: str = "", cwd: str = ""
) -> dict[str, HostFacts]:
    """srun --label's output of the probe, task i on the i-th node, into each node's facts (probe.read_facts, as
    every backend's); a node whose probe did not finish is left out. The master port's answer is kept for the
    master node alone (the node named ``master``, or whose hostname is). Pure."""
    per_task: dict[int, list[str]] = {}
    for rank, line in (srun_demux()(t)[0] for t in text.splitlines()):
        if rank is not None and rank < len(nodes):
            per_task.setdefault(rank, []).append(line)
    out: dict[str, HostFacts] = {}
    for i, node in enumerate(nodes):
        found = probe.parse("\n".join(per_task.get(i, [])))
        if not found.complete:
            continue
        facts = probe.facts_of(node, found, script=script or None, cwd=cwd or None)
        if master not in (node, facts.hostname):
            facts.port_free = None
        out[node] = facts
    return out


def probe_nodes(
    nodes: list[str], master: str, python: str, environ: Mapping[str, str], script: str = "", port: int = 0
) -> tuple[Optional[dict[str, HostFacts]], Optional[str]]:
    """(each node's facts, in the plan's order, or None when srun cannot tell; srun's words when it said why)."""
    import shutil

    if shutil.which("srun", path=environ.get("PATH")) is None or not slurm.has_config(environ):
        return None, None
    env = {k: v for k, v in environ.items() if k not in CONTRACT and k != JOB_ID}
    cwd = os.getcwd()
    try:
        out = subprocess.run(
            probe_argv(nodes, environ.get("SLURM_JOB_ID", ""), master, python, script, port, cwd),
            env=env,
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.SubprocessError):
        return None, None
    facts = read_probe_output(out.stdout, nodes, master, script, cwd)
    if len(facts) == len(nodes):
        return {node: facts[node] for node in nodes}, None
    words = [line for line in out.stderr.splitlines() if "error" in line.lower()][:3]
    return None, "; ".join(words) or None


def detect(plan: LaunchPlan, environ: Mapping[str, str]) -> Optional[dict[str, HostFacts]]:
    """The planner's one look through this backend: the allocation's nodes, probed through srun."""
    return probe_allocation(plan, environ, probe_nodes)


def probe_allocation(
    plan: LaunchPlan, environ: Mapping[str, str], probe_with: Callable[..., tuple]
) -> Optional[dict[str, HostFacts]]:
    """Inside an allocation (unless --no-ssh-check): each node's facts (``probe_with``: probe_nodes), what would
    fail every rank on a node refused (plan/slurm.py decides); the planner plans from the facts."""
    spec = plan.job
    if not (slurm.in_allocation(environ) and spec.ssh_check):
        return None
    script = spec.program[0] if spec.program and not spec.module and not spec.no_python else ""
    nodes = [n.host for n in plan.nodes]
    facts, error = probe_with(nodes, plan.master_addr, spec.python, environ, script=script, port=plan.master_port)
    check_nodes(facts, script, spec.python, plan.master_port, max(len(n.devices) for n in plan.nodes), error)
    if not facts:
        without_facts(plan, environ, error)
    return facts


def srun_env(plan: LaunchPlan, environ: Mapping[str, str]) -> dict[str, str]:
    """srun's whole environment: the launcher's without its own rank layout, the job's, ours. Pure."""
    base = {k: v for k, v in environ.items() if k not in CONTRACT and k != JOB_ID}
    return {**base, **plan.env, **plan.commands[0].env}


def sweep_argv(
    plan: LaunchPlan,
    spec: JobSpec,
    job: str,
    nodes: list[str],
    sig: int,
    since: float,
    groups: Optional[Mapping[str, Collection[int]]] = None,
) -> list[str]:
    """One task per node of the job, beside its step (--overlap), signalling the processes that
    carry the job's id there: what left the step's process tracking (a rank's setsid daemon); and reporting
    another user's process left in the process groups the ranks led (``groups``: {node: ids}; one argv for
    every task, so each takes its node's list, task i being the i-th node). Pure."""
    per_task = [sorted((groups or {}).get(node, ())) for node in nodes]
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
        *kill_argv(spec.python, plan.job_id, sig, since, per_task=per_task),
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

    def sweep(sig: int, ranks_groups: Optional[Callable[[], Mapping[str, Collection[int]]]] = None):
        nodes = where.known()  # (sets where.job with the nodes, and the ranks' nodes)
        job = where.job
        if nodes is None or job is None:
            return {}
        alive = [n for n in nodes if n not in lost()]
        if not alive:
            return {}
        try:
            out = subprocess.run(
                sweep_argv(plan, spec, job, alive, sig, since, ranks_groups() if ranks_groups else None),
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
