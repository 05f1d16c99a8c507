"""What users of torchrun, accelerate, DeepSpeed and gaudi_spawn type, caught before anything starts. Pure.

torchrun's spellings paste in (or are refused with a one-line pointer), a command that cannot be
what was meant (``gaudi-launch python train.py``, ``gaudi-launch version``, a script that is not
there) stops with a hint, and two slips that silently change a run get a note: a launcher option
written after the script (it goes to the script), and a script that reads ``--local_rank`` while
the launcher does not append it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from typing import Optional

from gaudi_launch.errors import UserError
from gaudi_launch.inputs.readfile import kind_of, read_bounded

# torchrun options that have no meaning for a launcher that starts every node itself.
_RDZV = (
    "--rdzv-backend",
    "--rdzv_backend",
    "--rdzv-endpoint",
    "--rdzv_endpoint",
    "--rdzv-id",
    "--rdzv_id",
    "--rdzv-conf",
    "--rdzv_conf",
)
_NODE_RANK = ("--node-rank", "--node_rank", "--machine_rank")  # torchrun's, accelerate launch's
# accelerate launch's options (accelerate/commands/launch.py) that have another name or no meaning here,
# each with what to type instead; the ones both spell alike (--module, --no_python, --use_deepspeed,
# --max_restarts) are ours already.
_ACCELERATE = {
    "--num_processes": "ranks are counted per host: --num_devices N (ranks on each host) with --hostfile H "
    "(the hosts); one host: --num_devices N",
    "--num_machines": "--num_nodes N with --hostfile H (the first N hosts)",
    "--main_process_ip": "--master_addr (default: the first host)",
    "--main_process_port": "--master_port",
    "--mpirun_hostfile": "--hostfile H (mpirun is the default backend for several hosts)",
    "--deepspeed_hostfile": "--hostfile H --use_deepspeed",
    "--deepspeed_inclusion_filter": "--include (DeepSpeed's syntax, 'host:0,1@host2')",
    "--deepspeed_exclusion_filter": "--exclude (DeepSpeed's syntax)",
    "--deepspeed_multinode_launcher": "--use_deepspeed --launcher pdsh|openmpi",
    "--gpu_ids": "export HABANA_VISIBLE_MODULES (or CUDA_VISIBLE_DEVICES) in this shell, or --include HOST:0,1",
    "--multi_gpu": "nothing: several devices or hosts are the default whenever there are several",
    "--mixed_precision": "a training option: pass --bf16 to the script (our runtime and transformers read it)",
    "--num_cpu_threads_per_process": "-x OMP_NUM_THREADS=N (by default each rank gets the cores of its card's "
    "NUMA share)",
    "--config_file": "accelerate's config is not read; --config takes gaudi-launch's own job file (YAML)",
}
_PYTHONS = re.compile(r"^(python[0-9.]*|pypy[0-9.]*)$")


def torchrun_option_error(name: str) -> Optional[UserError]:
    """For an option the command line does not know: a pointer when it is one of torchrun's or accelerate
    launch's."""
    if name in _NODE_RANK:
        return UserError(
            "gaudi-launch starts every node itself",
            where=name,
            hint="run it once, on one machine, with --hostfile listing the nodes (or inside a "
            "Slurm allocation); it gives each node its rank",
        )
    if name in _RDZV or name == "--rdzv_conf":
        return UserError(
            "there is no rendezvous: the master is the first host (--master_addr/--master_port)", where=name
        )
    if name in _ACCELERATE:
        return UserError("accelerate launch's option", where=name, hint=f"here: {_ACCELERATE[name]}")
    return None


def nproc_per_node(value: Optional[str], detected: Optional[int] = None) -> Optional[int]:
    """torchrun's --nproc-per-node: a number, or auto/gpu (the devices found: None here, so each
    host's device count is used), or cpu (this machine's CPU count)."""
    if value is None:
        return None
    text = value.strip().lower()
    if text in ("auto", "gpu", "hpu"):
        return detected
    if text == "cpu":
        return os.cpu_count() or 1
    if text.isdigit() and int(text) > 0:
        return int(text)
    raise UserError(f"--nproc-per-node {value!r}: a positive number, auto, gpu or cpu", where="--nproc-per-node")


def nnodes(value: Optional[str]) -> Optional[int]:
    """torchrun's --nnodes: N (MIN:MAX is elastic, which gaudi-launch does not do)."""
    if value is None:
        return None
    if value.isdigit() and int(value) > 0:
        return int(value)
    raise UserError(
        f"--nnodes {value!r}: a number of nodes",
        where="--nnodes",
        hint="elastic MIN:MAX ranges are not supported: give the number of hosts to use",
    )


def check_program(program: Sequence[str], *, module: bool, no_python: bool, cwd: str) -> None:
    """A SCRIPT that cannot be what was meant: stop before any rank starts."""
    if not program or module:
        return
    script = program[0]
    if no_python:
        return
    if _PYTHONS.match(os.path.basename(script)):
        raise UserError(
            f"SCRIPT is {script!r}: gaudi-launch runs the script with Python itself",
            where="SCRIPT",
            hint=f"drop '{script}': gaudi-launch {' '.join(program[1:2]) or 'train.py'} ...  "
            "(--python chooses the interpreter)",
        )
    path = script if os.path.isabs(script) else os.path.join(cwd, script)
    if os.path.exists(path):
        if not (os.path.isfile(path) or os.path.isdir(path)):  # a FIFO, a device: Python would wait on it
            raise UserError(
                f"{script} is {kind_of(os.stat(path).st_mode)}, not a script file",
                where="SCRIPT",
                hint="give the path of the Python script itself",
            )
        return
    if script in ("version", "help"):
        raise UserError(
            f"no script named {script!r} here", where="SCRIPT", hint=f"did you mean gaudi-launch --{script}?"
        )
    raise UserError(
        f"{script}: no such file (looked in {cwd})",
        where="SCRIPT",
        hint="give the script's path; -m runs a module, --no_python an executable",
    )


def _script_source(program: Sequence[str], module: bool, no_python: bool, cwd: str) -> Optional[str]:
    if not program or module or no_python:
        return None
    path = program[0] if os.path.isabs(program[0]) else os.path.join(cwd, program[0])
    try:  # non-blocking, regular files only: a FIFO as SCRIPT must not hang the notes
        return read_bounded(path, 1 << 20)[: 1 << 20].decode("utf-8", errors="replace")
    except OSError:
        return None


def misplaced_options(
    script_args: Sequence[str], launcher_options: Iterable[str], script_source: Optional[str]
) -> list[str]:
    """Launcher options written after SCRIPT that the script itself does not mention."""
    known = set(launcher_options)
    found = []
    for arg in script_args:
        name = arg.split("=", 1)[0]
        if name in known and name not in found:
            bare = name.lstrip("-")
            if script_source is not None and (bare in script_source or bare.replace("-", "_") in script_source):
                continue  # the script defines it too: it is the script's
            found.append(name)
    return found


def reads_local_rank(script_source: Optional[str]) -> bool:
    """Whether the script parses --local_rank itself (DeepSpeed-era scripts do)."""
    return script_source is not None and bool(re.search(r"""add_argument\(\s*['"]--local[_-]rank['"]""", script_source))


def notes(
    program: Sequence[str],
    *,
    module: bool,
    no_python: bool,
    cwd: str,
    append_local_rank: bool,
    launcher_options: Iterable[str],
) -> list[str]:
    """One-line notes for slips that would silently change the run."""
    source = _script_source(program, module, no_python, cwd)
    out = [
        f"{name} after the script goes to the script; put launcher options before SCRIPT"
        for name in misplaced_options(program[1:], launcher_options, source)
    ]
    if not append_local_rank and reads_local_rank(source):
        out.append(
            f"{program[0]} parses --local_rank but it is not appended (the rank is in LOCAL_RANK): it will "
            "see its default; add --append-local-rank to pass --local_rank=N"
        )
    return out
