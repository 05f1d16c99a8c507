"""Backend ``deepspeed``: DeepSpeed's launcher (pdsh or openmpi runner) starts gaudi_launch.worker.

What DeepSpeed would mangle travels in one base64 token (worker.encode_job): the job's
environment and the script's argv, so both arrive byte-exact through its quoting and pdsh's
shell line. Teardown is ours and job-scoped (teardown.signal_job): DeepSpeed's own SIGTERM
handler pkills by command-line pattern on every host, so its process group only ever gets SIGKILL.
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import tempfile
from typing import List, Mapping, Optional

from gaudi_launch.errors import UserError
from gaudi_launch.multinode import host_watch
from gaudi_launch.plan import Command, LaunchPlan
from gaudi_launch.planner import is_local_host
from gaudi_launch.spec import JobSpec
from gaudi_launch.supervise import JobResult, ProcSpec, Supervisor
from gaudi_launch.teardown import signal_job
from gaudi_launch.worker import ERROR_MARKER, encode_job


def job_dir(plan: LaunchPlan) -> str:
    return os.path.join(tempfile.gettempdir(), f"gaudi-launch-{plan.job_id}")


def deepspeed_exe(python: str) -> str:
    """The `deepspeed` script installed beside the ranks' interpreter, else the one on PATH."""
    beside = os.path.join(os.path.dirname(python), "deepspeed")
    return beside if os.path.exists(beside) else "deepspeed"


def include_selector(plan: LaunchPlan) -> str:
    return "@".join(f"{n.host}:{','.join(map(str, n.devices))}" for n in plan.nodes)


def hostfile_text(plan: LaunchPlan, slots: Mapping[str, int]) -> str:
    return "".join(f"{n.host} slots={slots.get(n.host, len(n.devices))}\n" for n in plan.nodes)


def rank_env(plan: LaunchPlan, environ: Mapping[str, str]) -> dict:
    """What every rank gets on top of DeepSpeed's own contract (RANK, LOCAL_RANK, ...)."""
    env = {name: environ[name] for name in plan.exported if name in environ}
    env.update(plan.env)
    env["GAUDI_LAUNCH_JOB_ID"] = plan.job_id
    return env


def single_local(plan: LaunchPlan) -> bool:
    return len(plan.nodes) == 1 and is_local_host(plan.nodes[0].host)


def build_argv(plan: LaunchPlan, spec: JobSpec, environ: Mapping[str, str], directory: str) -> List[str]:
    """Pure: DeepSpeed's command line for this plan."""
    if spec.no_python:
        raise UserError("the deepspeed backend runs Python programs only", where="--no_python")
    full = all(n.devices == list(range(len(n.devices))) for n in plan.nodes)
    if spec.launcher == "openmpi" and not full:
        raise UserError("DeepSpeed's openmpi runner cannot select devices", where="--include",
                        hint="use --backend mpirun (it honours --include/--exclude), or the pdsh runner")
    argv = [deepspeed_exe(spec.python)]
    if single_local(plan):
        # One local node: DeepSpeed's single-node mode (given a hostfile it insists on ssh to
        # localhost). A device subset then travels in the job token (GAUDI_LAUNCH_NODE_DEVICES).
        argv += ["--num_gpus", str(len(plan.nodes[0].devices))]
    else:
        argv += ["--hostfile", os.path.join(directory, "hostfile")]
        if not full:
            argv += ["--include", include_selector(plan)]
    argv += ["--master_addr", plan.master_addr, "--master_port", str(plan.master_port),
             "--launcher", spec.launcher]
    if spec.launcher_args:
        argv.append(f"--launcher_args={spec.launcher_args}")  # '=' form: a value may start with '-'
    if spec.ssh_port:
        argv += ["--ssh_port", str(spec.ssh_port)]
    if not spec.append_local_rank:
        argv.append("--no_local_rank")
    token = encode_job(rank_env(plan, environ), list(spec.program), spec.module)
    return argv + ["--module", "gaudi_launch.worker", token]


def commands(plan: LaunchPlan, spec: JobSpec, environ: Mapping[str, str]) -> List[Command]:
    directory = job_dir(plan)
    env = {"DS_ENV_FILE": os.path.join(directory, "job.env")}
    if plan.ssh_args:
        env["PATH"] = os.path.join(directory, "bin") + os.pathsep + environ.get("PATH", os.defpath)
    if single_local(plan):
        # No remote shell exports it here: the runner carries the id itself, so launch.py and the
        # ranks inherit it and job-scoped teardown finds them. (Multi-node, the runner must not
        # carry it: its own SIGTERM handler pkills by pattern on every host.)
        env["GAUDI_LAUNCH_JOB_ID"] = plan.job_id
    return [Command(host=plan.nodes[0].host, argv=build_argv(plan, spec, environ, directory), env=env)]


def write_job_dir(plan: LaunchPlan, directory: str) -> None:
    """The hostfile, an env file that shadows the user's .deepspeed_env (its values are already in
    the job token), and an `ssh` wrapper carrying our SSH options for pdsh and DeepSpeed's check."""
    os.makedirs(os.path.join(directory, "bin"), exist_ok=True)
    with open(os.path.join(directory, "hostfile"), "w") as f:
        f.write(hostfile_text(plan, {n.host: max(n.devices) + 1 for n in plan.nodes}))
    with open(os.path.join(directory, "job.env"), "w") as f:
        f.write(f"GAUDI_LAUNCH_JOB_ID={plan.job_id}\n")
    if plan.ssh_args:
        real = shutil.which("ssh") or "/usr/bin/ssh"
        wrapper = os.path.join(directory, "bin", "ssh")
        with open(wrapper, "w") as f:
            f.write("#!/bin/sh\nexec " + shlex.join([real, *plan.ssh_args]) + ' "$@"\n')
        os.chmod(wrapper, 0o755)


def run(plan: LaunchPlan, spec: JobSpec, environ: Optional[Mapping[str, str]] = None,
        **supervisor_options) -> JobResult:
    environ = os.environ if environ is None else environ
    exe = plan.commands[0].argv[0]
    if not (os.path.exists(exe) or shutil.which(exe)):
        raise UserError("DeepSpeed is not installed beside the ranks' Python", where="--backend deepspeed",
                        hint="pip install deepspeed (DS_BUILD_OPS=0 on machines without CUDA), or use --backend mpirun")
    if spec.launcher == "pdsh" and not shutil.which("pdsh"):
        raise UserError("pdsh is not installed on this host", where="--launcher pdsh",
                        hint="install it (Debian: apt-get install pdsh), or use --launcher openmpi or --backend mpirun")
    directory = job_dir(plan)
    write_job_dir(plan, directory)
    hosts = [n.host for n in plan.nodes]
    watch = host_watch(plan, spec, is_local_host)

    def stop(sig: int) -> None:
        alive = [h for h in hosts if not (watch and h in watch.lost)]
        signal_job(alive, plan.job_id, sig, ssh_args=plan.ssh_args, python=spec.python, is_local=is_local_host)

    rank_hosts = {r: n.host for n in plan.nodes for r in n.ranks}
    cmd = plan.commands[0]
    proc = ProcSpec(rank=0, host=cmd.host, argv=cmd.argv, env={**environ, **cmd.env}, label="deepspeed",
                    ranks=rank_hosts, stop=stop, demux=lambda: PdshDemux(hosts), alarm=node_failed)
    try:
        return Supervisor([proc], grace=spec.grace, log_dir=spec.log_dir, mask=plan.mask,
                          watch=watch.probe if watch else None, **supervisor_options).run()
    finally:
        shutil.rmtree(directory, ignore_errors=True)



_NODE_FAILED = re.compile(r"^pdsh@\S+: (\S+): ssh exited with exit code [1-9]")


def node_failed(line: str) -> bool:
    """pdsh's word that a node's launcher exited non-zero (a rank failed there)."""
    return bool(_NODE_FAILED.match(line))


class PdshDemux:
    """pdsh prefixes each remote line with 'HOST: ': keep it on output (which rank printed a
    line is not known beyond its host), strip it from error records so they are recognised."""

    def __init__(self, hosts):
        self.prefixes = tuple(f"{h.rsplit('@', 1)[-1]}: " for h in hosts)

    def __call__(self, line: Optional[str]):
        if line is None:
            return []
        for prefix in self.prefixes:
            if line.startswith(prefix) and line[len(prefix):].startswith(ERROR_MARKER):
                return [(None, line[len(prefix):])]
        return [(None, line)]
