"""Backend ``deepspeed``: DeepSpeed's launcher (pdsh or openmpi runner) starts gaudi_launch.process.worker.

No value reaches DeepSpeed's command lines: the job's environment, the script's argv and the working
directory travel in a private job file (jobdir.py) on every host, and argv names only its path and
digest, so `ps` on any host shows no secret and nothing is left for DeepSpeed's re-quoting or pdsh's
shell line to mangle or run. The runner itself gets a scrubbed environment (it re-exports PYTHON*,
MLFLOW*, MV2*, UCX* inside "..." on the remote shell line), runs in the job directory (it writes its
working directory unquoted into that line) and never installs its SIGTERM handler, which pkills by
pattern on every host (ds_runner.py). Teardown is ours and job-scoped (teardown.signal_job).
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Mapping
from typing import Optional

from gaudi_launch.errors import UserError
from gaudi_launch.inputs.backend_options import DeepSpeedOptions
from gaudi_launch.inputs.hostnames import is_local_host
from gaudi_launch.inputs.spec import JobSpec
from gaudi_launch.plan.contract import node_sizes_env
from gaudi_launch.plan.hostfacts import HostFacts
from gaudi_launch.plan.launchplan import Command, LaunchPlan
from gaudi_launch.process.relay import untag
from gaudi_launch.process.supervise import Hooks, JobResult, ProcSpec, supervise_job
from gaudi_launch.process.worker import job_argv
from gaudi_launch.remote import jobdir, sshmux
from gaudi_launch.remote.fanout import per_host
from gaudi_launch.remote.hostchecks import host_watch
from gaudi_launch.remote.hostprobe import facts_here
from gaudi_launch.remote.teardown import job_sweeper, signal_job
from gaudi_launch.wire import GRACE, JOB_DIR_SUFFIX, JOB_ID

# The runner's whole environment comes from these names (plus what commands() sets): none starts
# with a prefix DeepSpeed re-exports to the remote shell line (PYTHON, MLFLOW, MV2, UCX, NCCL).
RUNNER_ENV = (
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "TZ",
    "TMPDIR",
    "LD_LIBRARY_PATH",
    "SSH_AUTH_SOCK",
    "DS_ACCELERATOR",
)
# OpenMPI's own settings, for DeepSpeed's openmpi runner (mpirun reads them; DeepSpeed exports none).
RUNNER_PREFIXES = ("OMPI_", "PRTE_", "PMIX_")
# Host names, IPv4, IPv6 (with a zone id): what may stand after --master_addr= on pdsh's shell line.
_ADDR = re.compile(r"[A-Za-z0-9_:][A-Za-z0-9_.:-]*(%[A-Za-z0-9_.-]+)?")


def job_dir(plan: LaunchPlan) -> str:
    """This job's directory, the same path on every host: the job id and the plan's random suffix
    (wire.JOB_DIR_SUFFIX), so that a user who saw the id first cannot make it on a host before the job file
    gets there (the name shows only once the launcher has made its own)."""
    return jobdir.path_for(plan.job_id, suffix=plan.env.get(JOB_DIR_SUFFIX, ""))


def deepspeed_exe(python: str) -> str:
    """The `deepspeed` script installed beside the ranks' interpreter, else the one on PATH."""
    beside = os.path.join(os.path.dirname(python), "deepspeed")
    return beside if os.path.exists(beside) else "deepspeed"


def hostfile_text(plan: LaunchPlan) -> str:
    """The selected hosts, each with as many slots as it runs ranks. Pure.

    No --include goes to DeepSpeed: its selector splits on '@', so a `user@host` entry cannot be
    named in one, and a device subset travels in the job file anyway (GAUDI_LAUNCH_NODE_DEVICES,
    which the worker applies over what launch.py sets)."""
    return "".join(f"{n.host} slots={len(n.devices)}\n" for n in plan.nodes)


def rank_env(plan: LaunchPlan, environ: Mapping[str, str], grace: Optional[float] = None) -> dict:
    """What every rank gets on top of DeepSpeed's own contract (RANK, LOCAL_RANK, ...)."""
    env = {name: environ[name] for name in plan.exported if name in environ}
    env.update(plan.env)
    env.update(node_sizes_env([len(n.ranks) for n in plan.nodes]))
    env[JOB_ID] = plan.job_id
    if grace is not None:
        env[GRACE] = str(grace)  # for the ranks' watchdog (worker.watch_launcher)
    return env


def job_payload(plan: LaunchPlan, spec: JobSpec, environ: Mapping[str, str]) -> bytes:
    """The job file's content: the same bytes every time for one plan and working directory (its
    digest is on argv)."""
    return jobdir.payload(
        rank_env(plan, environ, spec.grace), list(spec.program), spec.module, os.getcwd(), plan.job_key
    )


def single_local(plan: LaunchPlan) -> bool:
    return len(plan.nodes) == 1 and is_local_host(plan.nodes[0].host)


def check_safe(value: str, pattern: re.Pattern, where: str, what: str) -> str:
    if not pattern.fullmatch(value):
        raise UserError(
            f"{value!r} is not a valid {what}: DeepSpeed pastes it into a remote shell line",
            where=where,
            hint=f"give a plain {what}, without spaces or shell characters",
        )
    return value


def build_argv(plan: LaunchPlan, spec: JobSpec, environ: Mapping[str, str], directory: str) -> list[str]:
    """Pure: DeepSpeed's command line for this plan (run by ds_runner in the ranks' interpreter)."""
    if spec.no_python:
        raise UserError("the deepspeed backend runs Python programs only", where="--no_python")
    ds = spec.options(DeepSpeedOptions)
    full = all(n.devices == list(range(len(n.devices))) for n in plan.nodes)
    if ds.launcher == "openmpi" and not full:
        raise UserError(
            "DeepSpeed's openmpi runner cannot select devices",
            where="--include",
            hint="use --backend mpirun (it honours --include/--exclude), or the pdsh runner",
        )
    check_safe(plan.master_addr, _ADDR, "--master_addr", "host name or address")
    check_safe(directory, jobdir.SAFE_PATH, "TMPDIR", "directory path")
    check_safe(spec.python, jobdir.SAFE_PATH, "--python", "interpreter path")  # pdsh's line runs it
    argv = [spec.python, "-m", "gaudi_launch.backends.ds_runner"]
    if single_local(plan):
        # One local node: DeepSpeed's single-node mode (given a hostfile it insists on ssh to
        # localhost). A device subset then travels in the job file (GAUDI_LAUNCH_NODE_DEVICES).
        argv += ["--num_gpus", str(len(plan.nodes[0].devices))]
    else:
        # --force_multi: with one selected host DeepSpeed would take its local path and run the
        # ranks here, whatever host the hostfile names.
        argv += ["--hostfile", os.path.join(directory, "hostfile"), "--force_multi"]
    argv += ["--master_addr", plan.master_addr, "--master_port", str(plan.master_port), "--launcher", ds.launcher]
    if ds.launcher_args:
        argv.append(f"--launcher_args={ds.launcher_args}")  # '=' form: a value may start with '-'
    if spec.ssh_port:
        argv += ["--ssh_port", str(spec.ssh_port)]
    if not spec.append_local_rank:
        argv.append("--no_local_rank")
    job = jobdir.digest(job_payload(plan, spec, environ))
    return argv + ["--module", "gaudi_launch.process.worker", *job_argv(os.path.join(directory, jobdir.JOB_FILE), job)]


def detect(plan: LaunchPlan, environ: Mapping[str, str]) -> dict[str, HostFacts]:
    """The facts of the hosts that are this machine when no pre-flight read them (remote/hostprobe.py); whether
    DeepSpeed and pdsh are here is run()'s check (a dry run shows the plan on a machine without them)."""
    return facts_here(plan)


def commands(plan: LaunchPlan, environ: Mapping[str, str]) -> list[Command]:
    spec = plan.job
    directory = job_dir(plan)
    env = {"DS_ENV_FILE": os.path.join(directory, "job.env")}
    if plan.ssh_args:
        env["PATH"] = os.path.join(directory, "bin") + os.pathsep + environ.get("PATH", os.defpath)
    if single_local(plan):
        # No remote shell exports it here: the runner carries the id itself, so launch.py and the
        # ranks inherit it and job-scoped teardown finds them. (Multi-node, the runner must not
        # carry it: teardown would find the runner and pdsh, whose group is ours to SIGKILL.)
        env[JOB_ID] = plan.job_id
    if spec.options(DeepSpeedOptions).launcher == "openmpi" and os.geteuid() == 0:
        # As the mpirun backend passes --allow-run-as-root only as root.
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return [Command(host=plan.nodes[0].host, argv=build_argv(plan, spec, environ, directory), env=env)]


def runner_env(environ: Mapping[str, str], extra: Mapping[str, str]) -> dict[str, str]:
    """The runner's whole environment: a few plain variables of the launcher's, then ours. Pure."""
    env = {k: v for k, v in environ.items() if k in RUNNER_ENV or k.startswith(RUNNER_PREFIXES)}
    env.update(extra)
    return env


def write_job_dir(plan: LaunchPlan, directory: str, job: bytes) -> None:
    """Fresh and private: the hostfile, an env file that shadows the user's .deepspeed_env (its values
    are in the job file), the job file, and an `ssh` wrapper carrying our SSH options for pdsh."""
    try:
        jobdir.create(directory)
    except FileExistsError:
        raise UserError(
            f"{directory} exists already ({jobdir.owner_of(directory)}); a job directory is never reused",
            where="TMPDIR",
            hint="remove it if no job of yours is running (another user's: ask them, or set TMPDIR to a "
            "directory of your own)",
        ) from None
    jobdir.remove_when_gone(directory, plan.job_id)  # after a SIGKILL too, where no rank runs
    os.mkdir(os.path.join(directory, "bin"), 0o700)
    jobdir.write_private(os.path.join(directory, "hostfile"), hostfile_text(plan).encode())
    jobdir.write_private(os.path.join(directory, "job.env"), f"{JOB_ID}={plan.job_id}\n".encode())
    jobdir.write_private(os.path.join(directory, jobdir.JOB_FILE), job)
    if plan.ssh_args:
        real = shutil.which("ssh") or "/usr/bin/ssh"
        wrapper = os.path.join(directory, "bin", "ssh")
        jobdir.write_private(wrapper, ("#!/bin/sh\nexec " + shlex.join([real, *plan.ssh_args]) + ' "$@"\n').encode())
        os.chmod(wrapper, 0o700)


def on_hosts(
    hosts: list[str], remote_argv: list[str], ssh_args: list[str], data: bytes = b"", timeout: float = 60.0
) -> dict[str, str]:
    """Run one command on every host at once over ssh (the one remote line quoted from a list),
    ``data`` on its stdin; {host: what went wrong} for the hosts where it failed."""

    def one(host: str) -> Optional[str]:
        try:
            out = subprocess.run(
                ["ssh", *ssh_args, host, shlex.join(remote_argv)], input=data, capture_output=True, timeout=timeout
            )
        except (OSError, subprocess.SubprocessError) as exc:
            return str(exc)
        if out.returncode != 0:
            return out.stderr.decode(errors="replace").strip() or f"exit code {out.returncode}"
        return None

    done = per_host(
        hosts, one, timeout=timeout + 5, default=lambda _: f"no answer within {timeout:g} s", name="on-hosts"
    )
    return {host: why for host, why in done.items() if why is not None}


def ship_job(plan: LaunchPlan, spec: JobSpec, directory: str, job: bytes) -> list[str]:
    """The job file to the same path on every other host, over ssh's stdin; the hosts it reached."""
    remote = [n.host for n in plan.nodes if not is_local_host(n.host)]
    if not remote:
        return []
    receive = [spec.python, "-m", "gaudi_launch.remote.jobdir", "receive", directory, jobdir.digest(job)]
    failed = on_hosts(remote, receive, plan.ssh_args, job)
    if failed:
        got = [h for h in remote if h not in failed]
        if got:  # nothing starts: the hosts that have the job file (its values in clear) lose it now
            remove_job_dir(got, spec, directory, plan.ssh_args)
        host, why = next(iter(failed.items()))
        raise UserError(
            f"could not put the job file on {host}: {why}",
            where=host,
            hint="check that gaudi-launch is installed there and that its temporary directory "
            "is writable; nothing was started",
        )
    return remote


def run(plan: LaunchPlan, environ: Optional[Mapping[str, str]] = None, **supervisor_options) -> JobResult:
    spec = plan.job
    environ = os.environ if environ is None else environ
    if not (os.path.exists(deepspeed_exe(spec.python)) or shutil.which("deepspeed")):
        raise UserError(
            "DeepSpeed is not installed beside the ranks' Python",
            where="--backend deepspeed",
            hint="pip install deepspeed (DS_BUILD_OPS=0 on machines without CUDA), or use --backend mpirun",
        )
    if spec.options(DeepSpeedOptions).launcher == "pdsh" and not shutil.which("pdsh"):
        raise UserError(
            "pdsh is not installed on this host",
            where="--launcher pdsh",
            hint="install it (Debian: apt-get install pdsh), or use --launcher openmpi or --backend mpirun",
        )
    connections = sshmux.for_job(plan.job_id)
    try:
        if connections is not None:  # every ssh of the job over the pre-flight's open connections
            plan = dataclasses.replace(plan, ssh_args=[*plan.ssh_args, *connections.client_args()])
        return _run(plan, spec, environ, **supervisor_options)
    finally:
        if connections is not None:
            connections.close()


def _run(plan: LaunchPlan, spec: JobSpec, environ: Mapping[str, str], **supervisor_options) -> JobResult:
    directory = job_dir(plan)
    job = job_payload(plan, spec, environ)
    jobdir.clean_stale(os.path.dirname(directory))
    write_job_dir(plan, directory, job)
    remote: list[str] = []
    watch = host_watch(plan, spec, is_local_host)
    try:
        remote = ship_job(plan, spec, directory, job)
        return _supervise(plan, spec, environ, directory, watch, **supervisor_options)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
        jobdir.stop_watch(directory)
        remote = [h for h in remote if not (watch and h in watch.lost)]
        if remote:
            remove_job_dir(remote, spec, directory, plan.ssh_args)


def remove_job_dir(hosts: list[str], spec: JobSpec, directory: str, ssh_args: list[str]) -> None:
    """The job directory off ``hosts`` (a SIGKILLed launcher's is removed by the ranks' watch there)."""
    on_hosts(
        hosts,
        [spec.python, "-m", "gaudi_launch.remote.jobdir", "remove", directory],
        ssh_args,
        timeout=max(5.0, spec.ssh_timeout),
    )


def _supervise(
    plan: LaunchPlan, spec: JobSpec, environ: Mapping[str, str], directory: str, watch, **supervisor_options
) -> JobResult:
    hosts = [n.host for n in plan.nodes]
    connections = sshmux.for_job(plan.job_id)
    via = connections.agent_run if connections is not None else None  # the pre-flight's sessions

    def stop(sig: int) -> None:
        alive = [h for h in hosts if not (watch and h in watch.lost)]
        signal_job(alive, plan.job_id, sig, ssh_args=plan.ssh_args, python=spec.python, is_local=is_local_host, via=via)

    rank_hosts = {r: n.host for n in plan.nodes for r in n.ranks}
    cmd = plan.commands[0]
    # cwd: DeepSpeed writes its working directory unquoted into pdsh's shell line; ours is safe.
    proc = ProcSpec(
        rank=0,
        host=cmd.host,
        argv=cmd.argv,
        env=runner_env(environ, cmd.env),
        cwd=directory,
        label="deepspeed",
        ranks=rank_hosts,
    )
    sweep = job_sweeper(
        hosts,
        plan.job_id,
        ssh_args=plan.ssh_args,
        python=spec.python,
        is_local=is_local_host,
        lost=lambda: watch.lost if watch else (),
        via=via,
    )  # also after a success: a rank's daemon
    hooks = Hooks(
        demux=lambda: PdshDemux(hosts),
        stop=stop,
        alarm=node_failed,
        watch=watch.probe if watch else None,
        sweep=sweep,
    )
    return supervise_job(plan, [proc], hooks, **supervisor_options)


_NODE_FAILED = re.compile(r"^pdsh@\S+: (\S+): ssh exited with exit code [1-9]")


def node_failed(line: str) -> bool:
    """pdsh's word that a node's launcher exited non-zero (a rank failed there)."""
    return bool(_NODE_FAILED.match(line))


class PdshDemux:
    """Which rank printed a line: each rank's relay (relay.py) tags its lines with its rank, and
    pdsh puts 'HOST: ' before remote lines. Tagged lines lose both; DeepSpeed's own lines (the
    runner, launch.py, pdsh) keep their host and are nobody's rank."""

    def __init__(self, hosts):
        self.prefixes = tuple(f"{h.rsplit('@', 1)[-1]}: " for h in hosts)

    def __call__(self, line: Optional[str]):
        if line is None:
            return []
        rank, text = untag(line)
        if rank is not None:
            return [(rank, text)]
        for prefix in self.prefixes:
            if line.startswith(prefix):
                rank, text = untag(line[len(prefix) :])
                if rank is not None:
                    return [(rank, text)]
        return [(None, line)]
