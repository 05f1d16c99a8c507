"""``--sbatch job.sh``: a batch script that runs this same job inside its own allocation.

The allocation's options become #SBATCH lines; the script then runs gaudi-launch, which inside the
allocation is the slurm backend. The job's values (env files, -x) go to a private env file beside
the script (0600, never on a command line, never through a shell: gaudi-launch reads it with
--env-file); the one command line of the script is quoted from a list (shlex), so bash takes every
word literally. Each #SBATCH word is quoted as sbatch reads it (Slurm's src/sbatch/opt.c,
_get_argument: quotes group, a backslash escapes, an unquoted '#' ends the line), so a value with a
space stays one option's value; a control character is refused (a newline in a comment line would
start a command).
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping

from gaudi_launch.errors import UserError
from gaudi_launch.inputs.backend_options import SlurmOptions
from gaudi_launch.inputs.spec import JobSpec
from gaudi_launch.plan.launchplan import LaunchPlan
from gaudi_launch.plan.slurm import LATER, node_names
from gaudi_launch.wire import write_private


def env_file_text(env: Mapping[str, str]) -> str:
    """NAME="value" lines that gaudi-launch's env-file reader turns back into exactly ``env``. Pure."""

    def quote(value: str) -> str:
        return (
            '"'
            + (
                value.replace("\\", "\\\\")
                .replace('"', '\\"')
                .replace("\n", "\\n")
                .replace("\t", "\\t")
                .replace("$", "\\$")
            )
            + '"'
        )

    return "".join(f"{name}={quote(value)}\n" for name, value in sorted(env.items()))


# Words sbatch and bash both take as they are; anything else is quoted.
_PLAIN = re.compile(r"[A-Za-z0-9_.,:=/@%+-]+")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def sbatch_quote(word: str) -> str:
    """One #SBATCH word that sbatch reads back as ``word``: double quotes, with backslash before a
    backslash or a double quote (both escapes _get_argument honours inside quotes). Pure."""
    if _PLAIN.fullmatch(word):
        return word
    return '"' + word.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _refuse_control(text: str, what: str) -> None:
    bad = _CONTROL.search(text)
    if bad:
        raise UserError(
            f"{what} {text!r} holds a control character ({bad.group()!r}), which cannot go into a batch script",
            where="--sbatch",
            hint="use a value without newlines, tabs or escapes",
        )


def sbatch_lines(plan: LaunchPlan, spec: JobSpec, cwd: str) -> list[str]:
    """The allocation: nodes, tasks per node and the login-node options. Pure."""
    lines = [
        f"--job-name=gaudi-launch-{plan.job_id}",
        f"--nodes={len(plan.nodes)}",
        f"--ntasks-per-node={len(plan.nodes[0].ranks)}",
        f"--chdir={cwd}",
    ]
    named = [n.host for n in plan.nodes if n.host != LATER]
    if named:
        lines.append("--nodelist=" + ",".join(named))
    if spec.exclude:
        lines.append("--exclude=" + ",".join(node_names(spec.exclude, "--exclude")))
    slurm = spec.options(SlurmOptions)
    for option, value in (("--partition", slurm.partition), ("--time", slurm.time), ("--account", slurm.account)):
        if value:
            lines.append(f"{option}={value}")
    if slurm.slurm_args:
        lines += shlex.split(slurm.slurm_args)
    for line in lines:
        _refuse_control(line, "the #SBATCH option")
        if "packjob" in line.lower():  # _get_argument blanks this word anywhere on the line, quoted or not
            raise UserError(f"sbatch would cut 'packjob' out of {line!r}", where="--sbatch")
    return lines


def launcher_argv(plan: LaunchPlan, spec: JobSpec, env_file: str) -> list[str]:
    """gaudi-launch inside the allocation, with this job's options. Pure."""
    argv = [
        spec.python,
        "-m",
        "gaudi_launch",
        "--backend",
        "slurm",
        "--num_devices",
        str(len(plan.nodes[0].ranks)),
        "--grace",
        repr(float(spec.grace)),
        "--env-file",
        env_file,
    ]
    if spec.master_port:
        argv += ["--master_port", str(spec.master_port)]
    if spec.log_dir:
        argv += ["--log-dir", os.path.abspath(spec.log_dir)]
    for prefix in spec.export_prefixes:
        argv += ["--export-prefix", prefix]
    if spec.efa is not None:
        argv.append("--efa" if spec.efa else "--no-efa")
    if spec.hccl_ofi_wrapper:
        argv += ["--hccl-ofi-wrapper", spec.hccl_ofi_wrapper]
    if not spec.ssh_check:
        argv.append("--no-ssh-check")
    argv += ["--python", spec.python]
    argv += ["-m"] if spec.module else ["--no_python"] if spec.no_python else []
    return argv + list(spec.program)


def script_text(plan: LaunchPlan, spec: JobSpec, env_file: str, cwd: str) -> str:
    _refuse_control(env_file, "the script path")  # it is written into comment lines
    lines = [
        "#!/bin/bash",
        "# Written by gaudi-launch --sbatch; submit it with: sbatch "
        + shlex.quote(spec.options(SlurmOptions).sbatch or ""),
        "# Inside the allocation gaudi-launch runs one srun for the whole job; the job's environment",
        f"# is in {env_file} (private to you).",
    ]
    lines += [f"#SBATCH {sbatch_quote(line)}" for line in sbatch_lines(plan, spec, cwd)]
    lines.append("exec " + shlex.join(launcher_argv(plan, spec, env_file)))
    return "\n".join(lines) + "\n"


def write(plan: LaunchPlan, spec: JobSpec, environ: Mapping[str, str]) -> dict[str, str]:
    """The script (0700) and its env file (0600), both new: an existing file is never overwritten."""
    script = spec.options(SlurmOptions).sbatch
    if not script:
        raise ValueError("no --sbatch path to write the script to")
    path = os.path.abspath(script)
    _refuse_control(path, "the script path")
    env_file = path + ".env"
    for p in (path, env_file):
        if os.path.lexists(p):
            raise UserError(f"{p} exists already", where="--sbatch", hint="give a new file name, or remove it")
    try:
        write_private(env_file, env_file_text({k: v for k, v in plan.env.items()}).encode())
        write_private(path, script_text(plan, spec, env_file, os.getcwd()).encode())
        os.chmod(path, 0o700)
    except OSError as exc:
        raise UserError(f"cannot write {exc.filename}: {exc.strerror}", where="--sbatch") from None
    return {"script": path, "env_file": env_file}
