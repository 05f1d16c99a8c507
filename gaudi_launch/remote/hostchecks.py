"""The pre-flight of a plan's hosts, before the job (over ssh: remote/preflight.py), and the watch over
them while it runs. I/O at the edge of the planner: ``build_plan`` gets ``default_preflight`` passed in by
the composition root and plans from its report (plan/multinode.py's finish_plan), never calling out itself.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Optional

from gaudi_launch.inputs.backend_options import capabilities
from gaudi_launch.inputs.hostnames import is_local_host
from gaudi_launch.inputs.spec import JobSpec
from gaudi_launch.inputs.sshconfig import SshConfig, SshConfigError
from gaudi_launch.plan import fanoutmode
from gaudi_launch.plan.contract import visible_subset
from gaudi_launch.plan.launchplan import LaunchPlan
from gaudi_launch.plan.multinode import configured_host_keys, master_host, ssh_args, visible_modules
from gaudi_launch.remote import openmpi, partialnodes, probe, samemachine, sshmux, treeprobe, versions
from gaudi_launch.remote.preflight import CheckReport, SshOptions, check_hosts
from gaudi_launch.remote.sshresolve import resolve
from gaudi_launch.remote.watch import HostWatch, ssh_endpoints
from gaudi_launch.wire import SSH_SHARE


def run_preflight(plan: LaunchPlan, spec: JobSpec, *, local, progress=None, share: bool = True, one_pass=None):
    """The pre-flight of ``plan``'s hosts. With ``share``, its ssh to each remote host stays open as
    the job's connection to it (sshmux), used by every later ssh of the job and closed at its end.

    ``one_pass`` (treeprobe.TreeResult): the hosts' probe outputs as the job's own ranks sent them and the hosts
    its mpirun's hops named (remote/onepass.py), judged as the tree's answers; with its ``error`` set (that
    mpirun ended before every host answered) the other hosts are probed through the tree, the named ones not
    tried again."""
    connections = None
    hosts = [n.host for n in plan.nodes]
    probed = hosts + [h for h in plan.spares if h not in hosts]  # a spare that cannot run the job: said now
    remote = [h for h in probed if not local(h)]
    tree = fan_out(plan, spec, len(remote)) == "tree" or one_pass is not None
    if not tree and share and remote and os.environ.get(SSH_SHARE, "1") != "0":
        connections = sshmux.open_for(plan.job_id, ssh_args(spec, configured_host_keys(hosts, spec.ssh_config)))
    script = spec.program[0] if spec.program and not spec.module else None
    # module ids: the slots through the HABANA_VISIBLE_MODULES the ranks inherit there ("Gaudi-to-process
    # Assignment"); the pre-flight checks them against hl-smi's cards (partial nodes, busy cards)
    modules = {
        n.host: [int(m) for m in visible_subset(visible_modules(plan, n.host), n.devices).split(",")]
        for n in plan.nodes
    }
    through: dict = {}  # the tree's result, when the probe went through it
    report = check_hosts(
        probed,
        python=spec.python,  # --no_python ranks start through our bootstrap too
        script=script,
        cwd=os.getcwd(),
        master_host=master_host(plan),
        master_addr=plan.master_addr,
        master_port=plan.master_port,
        devices_needed={**plan.spares, **{n.host: len(n.devices) for n in plan.nodes}},
        modules_needed=modules,
        ssh=ssh_options(spec),
        local=local,
        progress=progress,
        connections=connections,
        tree=(
            (lambda port: through.setdefault("tree", _probe_through_tree(plan, spec, remote, script, port)))
            if one_pass is None
            else (lambda port: through.setdefault("tree", _after_one_pass(one_pass, plan, spec, remote, script, port)))
        )
        if tree
        else None,
        pythonpath=ranks_pythonpath(plan),
    )
    if through.get("tree") is not None and through["tree"].error:
        report.warnings.append(tree_warning(through["tree"], remote))
    if capabilities(plan.backend).openmpi(spec.backend_options):
        openmpi.judge(report, openmpi.local_version())  # one major version on every host (before the spares)
    versions.judge(report, spec.allow_version_mismatch)  # the same software everywhere (issues 25, 32)
    partialnodes.judge(report, modules, spec.allow_partial_nodes)  # every card of each host in scale-out
    samemachine.judge(report)  # two names of one machine: named before mpirun's daemons collide there
    return spares_apart(report, hosts)


def ssh_options(spec: JobSpec) -> SshOptions:
    """How the pre-flight's ssh reaches the hosts: the job's --ssh-* options. Pure."""
    return SshOptions(
        port=spec.ssh_port,
        identity=spec.ssh_identity,
        config=spec.ssh_config,
        timeout=spec.ssh_timeout,
        strict=spec.strict_host_keys,
    )


def master_ssh_port(master: str, spec: JobSpec) -> int:
    """The port of a remote master's sshd, where the hosts check they reach it: --ssh-port, else the ssh
    config's Port for that host (as the flat pre-flight's target), else 22."""
    try:
        return resolve([master], ssh_options(spec), SshConfig(spec.ssh_config))[master].port
    except (SshConfigError, RuntimeError, KeyError):
        return spec.ssh_port or 22


def ranks_pythonpath(plan: LaunchPlan, environ=None) -> Optional[str]:
    """The PYTHONPATH the job's ranks on other hosts get: the plan's own (an env file's), else this
    launcher's, which the multi-host backends export to them (plan/fabric.py's EXPORT_NAMES; plan.exported is
    filled after the pre-flight)."""
    environ = os.environ if environ is None else environ
    return plan.env.get("PYTHONPATH") or environ.get("PYTHONPATH") or None


def fan_out(plan: LaunchPlan, spec: JobSpec, remote_hosts: int, environ=None) -> str:
    """ "tree" or "flat" for this plan (plan/fanoutmode.py): the tree where OpenMPI 4's mpirun starts the ranks;
    auto's threshold the one-pass tree's where it would go in one pass."""
    possible = capabilities(plan.backend).daemon_tree and openmpi.major(openmpi.local_version()) == 4  # (before detect)
    one_pass = fanoutmode.one_pass_possible(plan, spec, os.environ if environ is None else environ)
    return fanoutmode.choose(spec.fan_out, remote_hosts, possible, one_pass=one_pass)


def _probe_through_tree(plan: LaunchPlan, spec: JobSpec, remote: list[str], script, master_ssh_port: int):
    """The probe on the remote hosts through mpirun's daemon tree (treeprobe.py), with the commands the flat
    path would run (a remote master's also checks the master port); ``master_ssh_port``: what the hosts
    TCP-connect to for "master reachable" (check_hosts)."""
    master = master_host(plan)

    def command(check_port):
        return probe.command(
            spec.python,
            script,
            os.getcwd(),
            plan.master_addr,
            master_ssh_port,
            check_port,
            pythonpath=ranks_pythonpath(plan),
        )

    try:
        return treeprobe.run_tree(
            remote,
            python=spec.python,
            ssh_args=ssh_args(spec, configured_host_keys(remote, spec.ssh_config)),
            ssh_timeout=spec.ssh_timeout,
            radix=fanoutmode.radix(),
            tcp_cidr=plan.tcp_cidr,
            master_host=master if master in remote else None,
            master_command=command(plan.master_port),
            command=command(None),
        )
    except (OSError, subprocess.SubprocessError) as exc:  # mpirun would not run: every host the flat way
        return treeprobe.TreeResult(error=f"{type(exc).__name__}: {exc}")


def _after_one_pass(given, plan: LaunchPlan, spec: JobSpec, remote: list[str], script, master_ssh_port: int):
    """The one-pass job's answers, completed (when its mpirun ended first) by the tree's probe of the hosts that
    neither answered nor were named: one more pass, on failure only."""
    if not given.error:
        return given
    rest = [h for h in remote if h not in given.outputs and h not in given.failed]
    if not rest:
        return treeprobe.TreeResult(outputs=dict(given.outputs), failed=dict(given.failed))
    more = _probe_through_tree(plan, spec, rest, script, master_ssh_port)
    return treeprobe.TreeResult(
        outputs={**given.outputs, **more.outputs},
        failed={**given.failed, **more.failed},
        rounds=more.rounds + 1,
        elapsed_s=given.elapsed_s + more.elapsed_s,
        error=more.error,
    )


def tree_warning(result, remote: list[str]) -> str:
    """What the daemon tree could not tell, and so went one ssh per host, said once. Pure."""
    flat = [h for h in remote if h not in result.outputs and h not in result.failed]
    said = " | ".join(result.error.splitlines()[-3:])
    return (
        f"mpirun's daemon tree gave no answer for {len(flat)} host(s), checked one ssh each instead "
        f"(mpirun said: {said}); --fan-out flat skips the tree"
    )


def spares_apart(report: CheckReport, hosts: list[str]) -> CheckReport:
    """The report of the job's ``hosts``: a spare's findings leave it, a failed spare becoming a warning
    that names it (the job runs without it; it cannot take a lost host's place). Pure."""
    spares = [f for h, f in report.facts.items() if h not in hosts]
    if not spares:
        return report
    warnings = [
        f"spare host {f.host} failed the pre-flight: {_one_line(f.reason or 'failed')}"
        + (f" (fix: {_one_line(f.fix)})" if f.fix else "")
        + "; it cannot take a lost host's place until this is fixed"
        for f in spares
        if not f.ok
    ]
    return CheckReport(facts={h: report.facts[h] for h in hosts}, warnings=warnings + report.warnings)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def default_preflight(plan: LaunchPlan, spec: JobSpec):
    """The pre-flight as the CLI and DistributedRunner run it (progress lines on a terminal)."""
    return run_preflight(plan, spec, local=is_local_host, progress=progress_printer())


def progress_printer(stream=None):
    stream = stream or sys.stderr
    if not getattr(stream, "isatty", lambda: False)():
        return None

    def show(host: str, status: str) -> None:
        stream.write(f"  pre-flight {host}: {status}\n")
        stream.flush()

    return show


def host_watch(plan: LaunchPlan, spec: JobSpec, is_local):
    """A watch over the remote hosts of a running job, or None when every host is this one."""
    remote = [n.host for n in plan.nodes if not is_local(n.host)]
    return HostWatch(lambda: ssh_endpoints(remote, spec.ssh_port, spec.ssh_config)) if remote else None
