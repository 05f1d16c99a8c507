"""Backend ``mpirun`` (OpenMPI 4 and 5): one mpirun on this host starts every rank on every node.

Ranks start through gaudi_launch.process.worker, which maps OMPI_COMM_WORLD_* to torchrun's names.
Environment values never appear on the command line: ``-x NAME`` exports the value mpirun itself
has, and we give mpirun the job's environment.
"""

from __future__ import annotations

import dataclasses
import functools
import ipaddress
import json
import os
import re
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Collection, Mapping, Sequence
from typing import Callable, Optional

from gaudi_launch.errors import UserError
from gaudi_launch.inputs.hostnames import bare_host, is_local_host
from gaudi_launch.inputs.spec import JobSpec
from gaudi_launch.plan import fanoutmode
from gaudi_launch.plan.contract import node_sizes_env, worker_argv
from gaudi_launch.plan.hostfacts import HostFacts
from gaudi_launch.plan.launchplan import Command, LaunchPlan
from gaudi_launch.plan.multinode import PreflightFailed, findings, master_host
from gaudi_launch.process.failures import Culprit, describe_returncode, signal_name
from gaudi_launch.process.supervise import Hooks, JobResult, ProcSpec, supervise_job
from gaudi_launch.remote import jobdir, onepass, openmpi, probe, sshmux, treehop, treeprobe
from gaudi_launch.remote.hostchecks import fan_out, host_watch, master_ssh_port, ranks_pythonpath, run_preflight
from gaudi_launch.remote.hostprobe import facts_here
from gaudi_launch.remote.openmpi import OPENMPI_HOMES, OmpiDemux, local_mpirun, mpirun_and_prefix  # noqa: F401 (here before)
from gaudi_launch.remote.teardown import Sweep, job_sweeper, kill_argv, parse_sweep, sweep_job
from gaudi_launch.wire import GATE, GATE_KEY, GATE_PROBE, JOB_ID, NODE_SIZES

CONTRACT = ("MASTER_ADDR", "MASTER_PORT", "CROSS_SIZE", JOB_ID)


def openmpi_major(mpirun: str = "mpirun") -> Optional[int]:
    """4 or 5 from `mpirun --version`; None when mpirun is missing or not OpenMPI."""
    return openmpi.major(openmpi.local_version(mpirun))


# The MCA parameters that differ between OpenMPI 4 (ORTE) and 5 (PRRTE: its own parameters, passed
# with --prtemca; https://docs.open-mpi.org/en/v5.0.x/mca.html). 5 renamed the launcher's
# plm_rsh_* to plm_ssh_* and made oob_tcp_if_include a deprecated synonym of prte_if_include, as
# `prte_info --all` of OpenMPI 5.0.8 lists them (5.0.8's mpirun still maps the plm_rsh_* names, but
# silently drops orte_* ones; ompi issue #12873 asks for these names). btl_tcp_if_include belongs to
# the MPI library (the ranks' side), not the runtime, and kept its name.
MCA = {
    4: {
        "ssh_args": ("--mca", "plm_rsh_args"),
        "no_tree_spawn": ("--mca", "plm_rsh_no_tree_spawn"),
        "agent": ("--mca", "plm_rsh_agent"),
        "daemon_net": ("--mca", "oob_tcp_if_include"),
        "mpi_net": ("--mca", "btl_tcp_if_include"),
    },
    5: {
        "ssh_args": ("--prtemca", "plm_ssh_args"),
        "no_tree_spawn": ("--prtemca", "plm_ssh_no_tree_spawn"),
        "agent": ("--prtemca", "plm_ssh_agent"),
        "daemon_net": ("--prtemca", "prte_if_include"),
        "mpi_net": ("--mca", "btl_tcp_if_include"),
    },
}


def mca(version: Optional[int], what: str) -> list[str]:
    """The option and the parameter's name for ``what`` (a key of MCA) with this OpenMPI. Pure."""
    return list(MCA[5 if (version or 4) >= 5 else 4][what])


# Up to this long, the hosts go on the command line (`--host a:8,b:8`, what a user would type and a
# dry run shows in full); longer lists go to a hostfile in the job's private directory. Linux refuses
# one argument over 128 KiB (MAX_ARG_STRLEN): about 9,800 hosts x 8 with short names.
HOST_ARG_MAX = 16 * 1024
HOSTFILE = "mpirun-hosts"


def host_list(plan: LaunchPlan) -> str:
    """`--host a:2,b:8`: each host with the ranks it runs. Pure."""
    return ",".join(f"{bare_host(n.host)}:{len(n.ranks)}" for n in plan.nodes)


def is_uneven(plan: LaunchPlan) -> bool:
    return len({len(n.ranks) for n in plan.nodes}) > 1


def hostfile_path(plan: LaunchPlan) -> Optional[str]:
    """Where mpirun reads its hosts from when the list is too long for argv, or when a host names its
    login user (user@host: only OpenMPI's hostfile takes it apart, its --host keeps it in the node name and
    OpenMPI 4's daemons refuse it), else None. Pure."""
    total = sum(len(bare_host(n.host)) + 2 + len(str(len(n.ranks))) for n in plan.nodes)
    if total <= HOST_ARG_MAX and not any("@" in n.host for n in plan.nodes):
        return None

    return os.path.join(jobdir.path_for(plan.job_id), HOSTFILE)


def hostfile_text(plan: LaunchPlan) -> str:
    """OpenMPI's hostfile for the plan: each host with the slots it runs. Pure.

    Each entry as the hostfile has it, user@host included: OpenMPI 4 and 5 hand that user to their ssh
    (and rsh agent) as the destination, so mpirun's daemons log in as the pre-flight and every other ssh
    of the job do (inputs/sshconfig.login_user), not as ssh_config's User or the local user."""
    return "".join(f"{n.host} slots={len(n.ranks)}\n" for n in plan.nodes)


def build_argv(
    plan: LaunchPlan,
    spec: JobSpec,
    *,
    version: int,
    root: bool,
    exported: list[str],
    cores_per_host: Optional[int] = None,
    tcp_cidr: Optional[str] = None,
    rsh_args: Optional[list[str]] = None,
    hostfile: Optional[str] = None,
) -> list[str]:
    """The whole mpirun command line (the hosts from ``hostfile`` when given: see hostfile_path). Pure."""
    k = max(len(n.ranks) for n in plan.nodes)
    argv = ["mpirun"]
    if root:
        argv.append("--allow-run-as-root")
    argv += ["-n", str(plan.world_size)]
    argv += ["--hostfile", hostfile] if hostfile else ["--host", host_list(plan)]
    pe = (cores_per_host // k) if cores_per_host else 0
    # Even nodes: K per node (ppr). Uneven ones (--include 'a:0,1@b'): each host's slots are the ranks it
    # runs and mapping by slot fills them in host order, so ranks 0-1 are a's and the rest b's, as the plan
    # numbers them (OpenMPI's mpirun(1): --map-by slot, the default, "assign processes to each slot").
    mapping = "slot" if is_uneven(plan) else f"ppr:{k}:node"
    if pe >= 1:
        argv += ["--map-by", f"{mapping}:PE={pe}", "--bind-to", "core"]
    else:
        argv += ["--map-by", mapping, "--bind-to", "none"]
    # OpenMPI 5 rejects --rank-by core (optimum-habana PR #2320); slot means the same here.
    argv += ["--rank-by", "slot"]
    argv += ["--tag-output"] if version < 5 else ["--output", "tag"]
    if tcp_cidr:
        argv += [*mca(version, "mpi_net"), tcp_cidr]
        # PRRTE never takes loopback for its daemons' network: naming it leaves none and mpirun 5.0.8
        # stops ("No network interfaces were found for out-of-band communications"); one host needs none.
        if version < 5 or not ipaddress.ip_network(tcp_cidr, strict=False).is_loopback:
            argv += [*mca(version, "daemon_net"), tcp_cidr]
    if rsh_args:
        argv += [*mca(version, "ssh_args"), rsh_args_value(rsh_args)]
    for name in exported:
        argv += ["-x", name]
    argv += worker_argv(spec)
    return argv


# OpenMPI splits plm_rsh_args on spaces and knows no quoting: a space in a path would start a
# new ssh option (-oProxyCommand=... runs a command). Quotes and backslashes are refused as well.
_RSH_UNSAFE = re.compile(r"[\s'\"\\]")


def check_rsh_paths(spec: JobSpec) -> None:
    """--ssh-identity and --ssh-config travel in plm_rsh_args: refuse what would split them. Pure."""
    for option, value in (("--ssh-identity", spec.ssh_identity), ("--ssh-config", spec.ssh_config)):
        if value and _RSH_UNSAFE.search(value):
            raise UserError(
                f"the path {value!r} contains a space, quote or backslash, which mpirun would "
                "split into separate ssh options",
                where=option,
                hint="use a path without them (a symbolic link to the file will do)",
            )


def rsh_args_value(rsh_args: list[str]) -> str:
    """plm_rsh_args as the one space-separated string mpirun takes. Pure."""
    bad = [a for a in rsh_args if not a or _RSH_UNSAFE.search(a)]
    if bad:
        raise UserError(
            f"ssh option {bad[0]!r} cannot be passed through mpirun's plm_rsh_args",
            where="--backend mpirun",
            hint="use paths and values without spaces or quotes",
        )
    return " ".join(rsh_args)


def over_connections(argv: list[str], client_args: list[str], version: Optional[int] = 4) -> list[str]:
    """mpirun's argv with its daemons started over the job's open ssh connections (sshmux): the
    options join plm_rsh_args (5: plm_ssh_args), and every daemon is started from here (no tree
    spawn: a daemon starting others would make handshakes of its own). Pure."""
    argv = list(argv)
    value = rsh_args_value(list(client_args))
    name = mca(version, "ssh_args")[1]
    if name in argv:
        i = argv.index(name) + 1
        argv[i] = f"{argv[i]} {value}"
    else:
        argv[1:1] = [*mca(version, "ssh_args"), value]
    i = argv.index(name) + 1
    argv[i + 1 : i + 1] = [*mca(version, "no_tree_spawn"), "1"]
    return argv


def through_sessions(argv: list[str], agent: Callable[[int], Optional[str]]) -> list[str]:
    """``over_connections``' argv with the daemons started through the job's sessions (OpenMPI 4):
    ``agent(n)`` is mpirun's plm_rsh_agent for plm_rsh_args of n words (sshmux.Connections.rsh_agent),
    or None, and then the argv stays as it is (the daemons' ssh over the open connections). Pure."""
    i = argv.index("plm_rsh_args") + 1
    value = agent(len(argv[i].split()))
    if value is None:
        return list(argv)
    return argv[: i + 1] + ["--mca", "plm_rsh_agent", value] + argv[i + 1 :]


def with_radix(argv: list[str], radix: Optional[int]) -> list[str]:
    """mpirun's argv with its daemon tree's radix (OpenMPI 4's routed radix component), or as it is for
    OpenMPI's own (64). Pure."""
    if not radix:
        return list(argv)
    return [argv[0], "--mca", "routed", "radix", "--mca", "routed_radix", str(radix), *argv[1:]]


def exported_names(plan: LaunchPlan, extra: Sequence[str] = ()) -> list[str]:
    return sorted(set(plan.env) | set(CONTRACT) | set(extra))


def detect(plan: LaunchPlan, environ: Mapping[str, str]) -> dict[str, HostFacts]:
    """This host's OpenMPI (4 or 5: their flags differ), into the plan (None when there is none); the facts of
    the hosts that are this machine when no pre-flight read them (remote/hostprobe.py)."""
    plan.openmpi = openmpi_major(local_mpirun()[0])
    return facts_here(plan)


def commands(plan: LaunchPlan, environ: Mapping[str, str]) -> list[Command]:
    spec = plan.job
    if spec.append_local_rank:
        raise UserError(
            "--append-local-rank is not available with mpirun: ranks read LOCAL_RANK", where="--append-local-rank"
        )
    check_rsh_paths(spec)
    version = plan.openmpi
    if version is None:
        plan.notes.append("mpirun (OpenMPI) not found on this host: showing OpenMPI 4 flags")
    argv = build_argv(
        plan,
        spec,
        version=version or 4,
        root=os.geteuid() == 0,
        exported=exported_names(plan, [*plan.exported, *([NODE_SIZES] if is_uneven(plan) else [])]),
        # mpirun binds no rank: each binds itself to its card's NUMA node (plan/gaudi.py), or --cpu-bind none.
        # PE=<cores per host / ranks> would bind rank i to the i-th block of cores, whatever card it takes.
        cores_per_host=None,
        tcp_cidr=plan.tcp_cidr,
        rsh_args=plan.ssh_args,
        hostfile=hostfile_path(plan),
    )
    if "--hostfile" in argv:
        plan.notes.append(
            f"{len(plan.nodes)} hosts: mpirun reads them from {argv[argv.index('--hostfile') + 1]} "
            + (
                "(written when the job starts; its user@host lines give mpirun's ssh each host's user)"
                if any("@" in n.host for n in plan.nodes)
                else "(written when the job starts; the list is too long for one argument)"
            )
        )
    env = {
        "MASTER_ADDR": plan.master_addr,
        "MASTER_PORT": str(plan.master_port),
        "CROSS_SIZE": str(len(plan.nodes)),
        JOB_ID: plan.job_id,
        # uneven nodes: the ranks per node, from which a rank knows its node (RANK // K would be wrong)
        **node_sizes_env([len(n.ranks) for n in plan.nodes]),
    }
    remote = len({n.host for n in plan.nodes if not is_local_host(n.host)})
    if fan_out(plan, spec, remote) == "tree":
        radix = fanoutmode.radix(environ)
        plan.notes.append(
            f"--fan-out tree: {remote} remote hosts reached through OpenMPI's daemon tree "
            f"(radix {radix or 64}): the pre-flight, the daemons and the sweep; no ssh per host from here"
        )
    mpirun, prefix = local_mpirun()
    if prefix:
        argv = [mpirun, "--prefix", prefix, *argv[1:]]
        plan.notes.append(
            f"OpenMPI in {prefix}: --prefix {prefix}, so each host's daemon runs from there (ssh "
            "sessions do not get the PATH that found it here)"
        )
    return [Command(host=plan.nodes[0].host, argv=argv, env=env)]


def explain(lines: list[str], rank_hosts: Mapping[int, str]) -> Optional[Culprit]:
    """mpirun's own report of the first failing rank (used when the rank left no error record)."""
    text = "\n".join(lines)
    # OpenMPI 5 (PRRTE) wraps this message after "exited on" and names processes
    # "[prterun-host-pid@1,RANK]" where OpenMPI 4 wrote "[[JOB,1],RANK]".
    m = re.search(r"process rank (\d+) with PID \d+ on node (\S+) exited on\s+signal (\d+)", text)
    if m:
        rank = int(m.group(1))
        return Culprit(rank, rank_hosts.get(rank, m.group(2)), f"killed by {signal_name(int(m.group(3)))}", [])
    m = re.search(r"Process name:\s*\[(?:\[\d+,\d+\]|[^,\[\]\s]+),(\d+)\]\s*Exit code:\s*(\d+)", text)
    if m:
        rank = int(m.group(1))
        return Culprit(rank, rank_hosts.get(rank, "?"), f"exit code {m.group(2)}", [])
    return None


def daemons_not_started(hosts: Sequence[str]) -> Optional[str]:
    """At the start-up deadline: the hosts whose daemon's start (through the job's session there) has
    not returned, and what to do; None when there are none. Pure. OpenMPI 4 starts no rank before every
    daemon has called back, so these hosts keep every rank from starting, the other hosts' too."""
    if not hosts:
        return None
    listed = ", ".join(hosts[:8]) + (" ..." if len(hosts) > 8 else "")
    return (
        f"mpirun's daemon (orted) never started on {listed}: its start there has not returned. "
        f"Run `ssh {hosts[0]} orted --version` to see what hangs or fails on that host (a login script "
        "waiting for input, orted not on PATH or its libraries not on LD_LIBRARY_PATH in a non-interactive shell)"
    )


# Why the launcher watches the daemons itself. Over the job's sessions, mpirun starts every daemon
# from here (plm_rsh_no_tree_spawn: over_connections), and then ORTE (OpenMPI 4.1's
# orte/mca/plm/rsh/plm_rsh_module.c, ssh_launch's argv) has each orted --daemonize: opal_daemon_init
# (opal/util/daemon_init.c) forks and the parent exits 0 at once, before orte_init, so mpirun's
# rsh_wait_daemon sees a start that succeeded, and nothing of ORTE notices the detached daemon dying
# before its callback: mpirun waits in DAEMONS_LAUNCHED for ever. ORTE's own orte_startup_timeout
# (orte/runtime/orte_mca_params.c: "Seconds to wait for startup or job launch before declaring
# failed_to_start", default 0) does not cover this: its timer is armed in orte_plm_base_send_launch_msg
# (plm_base_launch_support.c), after every daemon has reported, and bounds the ranks' launch only
# (which --start-timeout covers already). So the session that started a daemon adopts it
# (sshmux.SESSION_AGENT, a child subreaper) and the supervisor asks, while ranks are starting, which
# adopted daemons ended (Hooks.start_check).


def daemons_died(ended: Mapping[str, Mapping[int, tuple[str, int]]]) -> Optional[str]:
    """The launch failure for daemons that ended before their host's ranks started: per host {pid:
    (name, exit code or -signal)} (sshmux.Connections.daemons_gone); None when none failed. Exit code 0
    is a daemon ORTE ordered to exit (the job's end, raced by the check), not a failure. Pure."""
    failed = {
        host: sorted((pid, name, code) for pid, (name, code) in found.items() if code != 0)
        for host, found in ended.items()
    }
    failed = {h: f for h, f in failed.items() if f}
    if not failed:
        return None
    hosts = sorted(failed)
    said = []
    for host in hosts[:8]:
        pid, name, code = failed[host][0]
        said.append(f"{host} ({name}, pid {pid}, {describe_returncode(code)})")
    listed = "; ".join(said) + (f" and {len(hosts) - 8} more host(s)" if len(hosts) > 8 else "")
    return (
        f"mpirun's daemon (orted) died after it detached and before it reported back to mpirun, on {listed}: "
        "mpirun starts no rank until every daemon has reported, and would have waited for it for ever. "
        f"Its own error output went to /dev/null when it detached: run `ssh {hosts[0]} orted --version` to "
        "check OpenMPI there, and set OMPI_MCA_orte_debug_daemons=1 to keep the daemons attached, so that "
        "mpirun shows why it fails"
    )


def tree_sweeper(
    hosts: Sequence[str],
    job_id: str,
    *,
    ssh_args: Sequence[str],
    python: str,
    is_local: Callable[[str], bool],
    lost: Callable[[], Collection[str]],
    radix: Optional[int],
    ssh_timeout: float,
    tcp_cidr: Optional[str],
) -> Callable[..., dict[str, Sweep]]:
    """``--fan-out tree``: the job's sweep (teardown.job_sweeper's contract) as one mpirun over OpenMPI's daemon
    tree, one rank per remote host still up, each running teardown's KILL_CODE with the process groups of its own
    host (one argv for all: $OMPI_COMM_WORLD_RANK picks them, as $SLURM_PROCID does under srun). This host, and a
    host the tree gave no answer for (a daemon that did not start), are swept as before (teardown.sweep_job)."""
    since = time.time() - 60  # (job_sweeper's: clock skew between hosts)

    def sweep(sig: int, ranks_groups=None) -> dict[str, Sweep]:
        alive = [h for h in hosts if h not in lost()]
        led = ranks_groups() if ranks_groups is not None else {}
        ids = {h: set(led.get(h, ())) for h in alive}
        remote = [h for h in alive if not is_local(h)]
        done: dict[str, Sweep] = {}
        if remote:
            argv = kill_argv(python, job_id, sig, since, per_task=[sorted(ids[h]) for h in remote])
            limit = 15.0 + ssh_timeout * (fanoutmode.depth(len(remote), radix) + 1)
            with tempfile.TemporaryDirectory(prefix="gaudi-launch-sweep-") as tmp:
                _, outputs, _ = treeprobe.run_round(
                    remote,
                    argv,
                    tmp=tmp,
                    name="sweep-hosts",
                    hop_python=None,
                    ssh_args=ssh_args,
                    radix=radix,
                    tcp_cidr=tcp_cidr,
                    timeout=limit,
                )
            for host, text in outputs.items():
                found = parse_sweep(text)
                if found.hit >= 0:
                    done[host] = found
        rest = [h for h in alive if h not in done]
        if rest:
            done.update(
                sweep_job(
                    rest,
                    job_id,
                    sig,
                    ssh_args=ssh_args,
                    python=python,
                    is_local=is_local,
                    since=since,
                    groups={h: ids[h] for h in rest},
                )
            )
        return {h: done[h] for h in alive if h in done}

    return sweep


def rank_hosts(plan: LaunchPlan) -> dict[int, str]:
    return {r: n.host for n in plan.nodes for r in n.ranks}


def run(plan: LaunchPlan, environ: Optional[Mapping[str, str]] = None, **supervisor_options) -> JobResult:
    spec = plan.job
    environ = os.environ if environ is None else environ
    if environ.get("OMPI_COMM_WORLD_SIZE"):
        raise UserError(
            "gaudi-launch is running inside an MPI job (OMPI_COMM_WORLD_SIZE is set)",
            where="--backend mpirun",
            hint="run gaudi-launch directly, not under mpirun",
        )
    if plan.openmpi is None:
        raise UserError(
            "mpirun (OpenMPI) is not installed on this host",
            where="--backend mpirun",
            hint="install OpenMPI (Debian: apt-get install openmpi-bin), or use --backend deepspeed",
        )
    connections = sshmux.for_job(plan.job_id)
    written = None
    try:
        written = write_hostfile(plan)
        return _run(plan, spec, environ, connections, **supervisor_options)
    finally:
        if written is not None:
            shutil.rmtree(os.path.dirname(written), ignore_errors=True)
            jobdir.stop_watch(os.path.dirname(written))
        if connections is not None:
            connections.close()


def write_hostfile(plan: LaunchPlan) -> Optional[str]:
    """The hostfile the plan's mpirun reads, in a fresh private directory of the job; None when the
    hosts are on its command line."""
    argv = plan.commands[0].argv
    if "--hostfile" not in argv:
        return None

    path = argv[argv.index("--hostfile") + 1]
    try:
        jobdir.create(os.path.dirname(path))
    except FileExistsError:
        raise UserError(
            f"{os.path.dirname(path)} exists already ({jobdir.owner_of(os.path.dirname(path))}); a job directory is never reused",
            where="TMPDIR",
            hint="remove it if no job of yours is running (another user's: ask them, or set TMPDIR to a "
            "directory of your own)",
        ) from None
    jobdir.remove_when_gone(os.path.dirname(path), plan.job_id)  # after a SIGKILL too, where no rank runs
    jobdir.write_private(path, hostfile_text(plan).encode())
    return path


def _run(plan: LaunchPlan, spec: JobSpec, environ: Mapping[str, str], connections, **supervisor_options) -> JobResult:

    cmd = plan.commands[0]
    argv, ssh_args = cmd.argv, plan.ssh_args
    env = {**environ, **plan.env, **cmd.env}
    if connections is not None:  # the pre-flight's connections, kept open for the job
        argv = over_connections(argv, connections.client_args(), plan.openmpi)
        ssh_args = [*ssh_args, *connections.client_args()]
        # OpenMPI 4: each daemon starts through the pre-flight's session on its host (no second
        # login shell there). OpenMPI 5 (prterun) keeps its own ssh, over the open connections.
        if plan.openmpi == 4 and not any(env.get(name) for name in fanoutmode.USER_RSH_AGENT):
            connections.serve_rsh()
            argv = through_sessions(argv, connections.rsh_agent)
    tree = (
        connections is None
        and fan_out(plan, spec, len({n.host for n in plan.nodes if not is_local_host(n.host)})) == "tree"
    )
    if tree:
        argv = with_radix(argv, fanoutmode.radix(environ))  # OpenMPI's own tree starts the daemons
    hosts = rank_hosts(plan)
    watch = host_watch(plan, spec, is_local_host)
    proc = ProcSpec(
        rank=0,
        host=cmd.host,
        argv=argv,
        env=env,
        label="mpirun",
        ranks=hosts,
    )
    # mpirun's own teardown misses what left a rank's process group (a setsid daemon): sweep by job id.
    if tree:  # the sweep through the same tree; a host it did not answer for by its own ssh
        sweep = tree_sweeper(
            list(dict.fromkeys(hosts.values())),
            plan.job_id,
            ssh_args=ssh_args,
            python=spec.python,
            is_local=is_local_host,
            lost=lambda: watch.lost if watch else (),
            radix=fanoutmode.radix(environ),
            ssh_timeout=spec.ssh_timeout,
            tcp_cidr=plan.tcp_cidr,
        )
    else:
        sweep = job_sweeper(
            list(dict.fromkeys(hosts.values())),
            plan.job_id,
            ssh_args=ssh_args,
            python=spec.python,
            is_local=is_local_host,
            lost=lambda: watch.lost if watch else (),
            via=connections.agent_run if connections is not None else None,
        )
    if tree and onepass.deferred(plan) and onepass.applies(plan, spec, environ):
        return _run_one_pass(plan, spec, environ, argv, env, proc, sweep, watch, hosts, supervisor_options)
    hooks = Hooks(
        demux=functools.partial(OmpiDemux, plan.openmpi),
        explain=lambda lines: explain(lines, hosts),
        watch=watch.probe if watch else None,
        sweep=sweep,
        starting=(lambda: daemons_not_started(connections.starting())) if connections is not None else None,
        start_check=(lambda started: daemons_died(connections.daemons_gone(skip=started)))
        if connections is not None
        else None,
    )
    return supervise_job(plan, [proc], hooks, **supervisor_options)


def _run_one_pass(plan, spec, environ, argv, env, proc, sweep, watch, hosts, supervisor_options) -> JobResult:
    """``--fan-out tree`` in one pass (remote/onepass.py): the job's mpirun, its ranks checking their hosts and
    waiting for the launcher's go; the pre-flight's failure raised with its table when a host fails."""
    where = onepass.gate_address(plan)  # this host's address on its route to the hosts
    server = onepass.GateServer(plan, bind_addr=where if onepass.is_ip(where) else "")
    try:
        master = master_host(plan)
        master_node = next(i for i, n in enumerate(plan.nodes) if n.host == master) if master in hosts.values() else -1
        # the probe each host's first rank runs (remote/probe.command: the ssh pre-flight's); the hosts TCP-connect
        # for "master reachable" to this listener when the master is this host, else to the master's sshd
        cwd, script = os.getcwd(), (spec.program[0] if spec.program and not spec.module else None)
        here = is_local_host(master)
        port = server.port if here else master_ssh_port(master, spec)
        pythonpath = ranks_pythonpath(plan)
        # (its Python checks run in the rank's own interpreter: process/gate.checks_here)
        check_port = None if here else plan.master_port
        probe_args = {
            "command": probe.command(
                spec.python, script, cwd, plan.master_addr, port, None, pythonpath=pythonpath, checks_by_caller=True
            ),
            "master_command": probe.command(
                spec.python,
                script,
                cwd,
                plan.master_addr,
                port,
                check_port,
                pythonpath=pythonpath,
                checks_by_caller=True,
            ),
            "checks": probe.checks_code(),
            "checks_argv": probe.checks_argv(cwd, pythonpath, plan.master_addr, port, None),
            "master_checks_argv": probe.checks_argv(cwd, pythonpath, plan.master_addr, port, check_port),
            "master_node": master_node,
        }
        env = {
            **env,
            GATE: f"{where}:{server.port}",
            GATE_KEY: server.key.hex(),
            GATE_PROBE: json.dumps(probe_args),
        }
        # every host's first rank probes its host, this one's too: the pre-flight judges those outputs, and runs
        # no probe of its own here (on the path between the last answer and the go)
        probed = list(dict.fromkeys(hosts.values()))
        remote = [h for h in probed if not is_local_host(h)]
        # each hop of the tree names the host it could not reach (treehop.py), in mpirun's error output
        hop = [
            "--mca",
            "plm_rsh_agent",
            treehop.agent(spec.python, fanoutmode.depth(len(remote), fanoutmode.radix(environ)) <= 1),
        ]
        argv = [argv[0], "-x", GATE, "-x", GATE_KEY, "-x", GATE_PROBE, *hop, *argv[1:]]
        # The job id (public: 8 hex digits, in every job directory's name) goes to the ranks on mpirun's command
        # line, not in mpirun's environment: the last rank of this host sweeps what carries it in its environment
        # (process/gate.py), while mpirun, which forks this host's ranks itself, still runs.
        i = next(k for k in range(len(argv) - 1) if argv[k] == "-x" and argv[k + 1] == JOB_ID)
        argv[i + 1] = f"{JOB_ID}={plan.job_id}"
        env = {k: v for k, v in env.items() if k != JOB_ID}
        said: list[str] = []

        def demux():
            inner = OmpiDemux(plan.openmpi)

            def one(line):
                if line is not None and treehop.FAILED in line:
                    said.append(line)
                return inner(line)

            return one

        ended, went = threading.Event(), threading.Event()
        box: dict = {}
        t0 = time.monotonic()
        streams = {k: onepass.HeldStream(supervisor_options.get(k) or getattr(sys, k)) for k in ("stdout", "stderr")}
        box["streams"] = streams

        def decide() -> None:
            limit = treeprobe.round_timeout(len(remote), fanoutmode.radix(environ), spec.ssh_timeout)
            server.wait_reports(probed, ended.is_set, t0 + limit)
            if ended.is_set() and not all(h in server.outputs for h in probed):
                return  # mpirun ended first (a daemon did not start): judged below
            given = treeprobe.TreeResult(outputs={h: server.outputs[h] for h in probed if h in server.outputs})
            given.elapsed_s = time.monotonic() - t0
            try:
                report = run_preflight(plan, spec, local=is_local_host, one_pass=given)
                box["report"] = report
                if report.ok:
                    delta, _ = onepass.facts_env(plan, spec, report.facts, environ)
                    delta = onepass.per_host(delta, {h: f.hostname for h, f in report.facts.items()})
                    for stream in box["streams"].values():  # the job's output from here on, as it comes
                        stream.release(True)
                    went.set()
                    server.decide(True, delta)
                    return
            except BaseException as exc:  # never leave the ranks waiting
                box["error"] = exc
            server.decide(False)

        decider = threading.Thread(target=decide, name="gaudi-launch-one-pass", daemon=True)
        decider.start()

        def swept_or_lost():
            server.wait_closed(1.0)
            return set(watch.lost if watch else ()) | set(server.swept)

        one_sweep = tree_sweeper(
            list(dict.fromkeys(hosts.values())),
            plan.job_id,
            ssh_args=plan.ssh_args,
            python=spec.python,
            is_local=is_local_host,
            lost=swept_or_lost,
            radix=fanoutmode.radix(environ),
            ssh_timeout=spec.ssh_timeout,
            tcp_cidr=plan.tcp_cidr,
        )
        hooks = Hooks(
            demux=demux,
            explain=lambda lines: explain(lines, hosts),
            # the host watch from the go on (before it, mpirun's own start is the test: a hanging host's sshd
            # is tried once, by its parent's hop)
            watch=(lambda: watch.probe() if went.is_set() else None) if watch else None,
            # nothing of the user's ran anywhere before the go: no sweep then (a hanging host is not tried again)
            sweep=lambda sig, ranks_groups=None: one_sweep(sig, ranks_groups) if went.is_set() else {},
        )
        options = {**supervisor_options, **streams}
        result = supervise_job(plan, [dataclasses.replace(proc, argv=argv, env=env)], hooks, **options)
        ended.set()
        decider.join()
        if "error" in box:
            raise box["error"]
        report = box.get("report")
        if report is None:  # mpirun ended before every host answered: the hosts its hops named, the rest probed
            given = treeprobe.TreeResult(
                outputs={h: server.outputs[h] for h in remote if h in server.outputs},
                failed={h: v for h, v in treehop.parse_failures("\n".join(said)).items()},
                error="mpirun ended before every host answered",
            )
            for entry in remote:  # (the hop names a host as ssh was given it)
                if entry not in given.failed and bare_host(entry) in given.failed:
                    given.failed[entry] = given.failed.pop(bare_host(entry))
            report = run_preflight(plan, spec, local=is_local_host, one_pass=given)
        for stream in streams.values():  # (held: the ranks were stopped, or mpirun ended before the verdict)
            stream.release(report.ok)
        if not report.ok:
            plan.preflight = findings(report)
            raise PreflightFailed(report)
        return result
    finally:
        server.close()
