"""A rank's steps on a host with Gaudi cards (the rank bootstrap, process/worker.py, calls them): its CPU binding
to its card's NUMA node, the bridge's import-time settings from the script's flags, the recipe cache in the job's
directory, HCCL's registration.

A module of its own so that a rank on a host without cards never imports it: the card and flag parsing it needs
(plan/gaudi.py, inputs/cards.py, scriptflags.py: dataclasses and argparse) were about a third of every rank's
start-up, paid on each rank of every job (issue 34: per-host cost at scale).
"""

from __future__ import annotations

import importlib
import os
import shutil
import socket
import sys
from collections.abc import MutableMapping

from gaudi_launch.inputs import cards
from gaudi_launch.inputs.idranges import id_ranges
from gaudi_launch.plan import gaudi
from gaudi_launch.remote.jobdir import owner_of
from gaudi_launch.scriptflags import hpu_env_for_script  # torch-free
from gaudi_launch.wire import CPU_BIND, JOB_ID, SYSFS, JobDirError, private_rank_dir, rank_dir


def hpu_env(script_args: list[str], environ: MutableMapping[str, str]) -> dict[str, str]:
    # The bridge reads lazy mode and the autocast op lists once, at import, and `import torch`
    # imports it (SynapseAI >= 1.18): they must be in place before the script's first line.
    job = environ.get(JOB_ID, "")
    try:
        job_dir = private_rank_dir(job, environ) if job else None
        return hpu_env_for_script(script_args, environ, job_dir)
    except JobDirError as exc:  # made first by someone else: never run without the requested op lists
        print(
            f"gaudi-launch worker: error: the job's directory {rank_dir(job, environ)} is not this user's "
            f"alone ({owner_of(rank_dir(job, environ))}): {exc}; this rank will not run without its autocast op lists and "
            "recipe cache. Remove it if it is yours, or set TMPDIR to a directory of your own",
            file=sys.stderr,
        )
        sys.exit(2)
    except OSError as exc:  # e.g. an unwritable TMPDIR: the runtime tries again, later
        print(
            f"gaudi-launch worker: could not write the autocast op lists ({exc}); set TMPDIR to a writable directory",
            file=sys.stderr,
        )
        return {}


def bind_cpus(environ: MutableMapping[str, str], threads_set: bool) -> None:
    """Bind this rank to its card's share of the card's NUMA node (plan/gaudi.py), unless --cpu-bind none.
    Done here, in every backend's rank, rather than with mpirun's or srun's own flags: only this host knows
    which card the rank takes and where that card sits. The host's cards come with the job when the plan had
    them (the pre-flight's probe read them there: gaudi.rank_cards); only without them does the rank run hl-smi
    itself (cards.read_host), and a host without hl-smi is left alone. Once bound, and unless the user set
    OMP_NUM_THREADS (``threads_set``), one OpenMP thread per physical core bound."""
    if environ.get(CPU_BIND) == "none":
        return
    sysfs = environ.get(SYSFS) or "/sys"
    host = gaudi.rank_cards(environ, socket.gethostname())
    if host is None:
        if not shutil.which("hl-smi"):
            return
        host = cards.read_host(sysfs=sysfs)
    cores = gaudi.rank_binding(environ, host)
    if not cores:
        return
    try:
        os.sched_setaffinity(0, cores)
    except OSError as exc:  # e.g. a cpuset (container, srun) without those cores: run unbound
        print(f"gaudi-launch worker: could not bind to cores {id_ranges(cores)} ({exc})", file=sys.stderr)
        return
    if not threads_set:
        siblings = {}
        for cpu in cores:
            try:
                with open(
                    os.path.join(sysfs, "devices", "system", "cpu", f"cpu{cpu}", "topology", "thread_siblings_list")
                ) as f:
                    siblings[cpu] = cards.parse_cpulist(f.read())
            except OSError:
                pass  # not known: a core of its own
        environ["OMP_NUM_THREADS"] = str(gaudi.omp_threads(cores, siblings))


def recipe_cache(environ: MutableMapping[str, str]) -> None:
    """PT_HPU_RECIPE_CACHE_CONFIG in the job's directory on this host, unless the user set it (plan/gaudi.py)."""
    job = environ.get(JOB_ID, "")
    if not job or environ.get(gaudi.RECIPE_VAR):
        return
    try:
        job_dir = private_rank_dir(job, environ)
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            kind = gaudi.fs_type(os.path.realpath(job_dir), f.read())
    except OSError:
        return
    value, why = gaudi.recipe_cache_setting(environ, job_dir, kind in gaudi.NETWORK_FS, gaudi.stack_version())
    if value is None:
        if environ.get("LOCAL_RANK") == "0":
            print(f"gaudi-launch worker: {why}", file=sys.stderr)
        return
    try:
        os.makedirs(os.path.join(job_dir, gaudi.RECIPE_DIR), 0o700, exist_ok=True)
    except OSError:
        return
    environ[gaudi.RECIPE_VAR] = value


def register_hccl() -> None:
    """Make dist.init_process_group("hccl") work for any script, as the bridge's autoload does on
    SynapseAI >= 1.18 (older stacks need this import, and scripts for torchrun lack it)."""
    try:
        importlib.import_module("habana_frameworks.torch.distributed.hccl")
    except Exception as exc:  # the script may not need it: say so and go on
        print(
            f"gaudi-launch worker: the HCCL backend did not load ({type(exc).__name__}: {exc}); "
            "init_process_group('hccl') will fail on this rank",
            file=sys.stderr,
        )
