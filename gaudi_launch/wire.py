"""What the launcher and its ranks share across the rank boundary, in one place so both ends agree: the
GAUDI_LAUNCH_* variables, the markers a rank writes on its stderr, where a job's private files live and
how they are checked, the heartbeat a rank touches, and which restart a rank belongs to.

Stdlib only and cheap to import: the rank side (the bootstrap, runtime/, a plain script calling
``gaudi_launch.heartbeat()``) imports this and nothing else of the launcher.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import tempfile
from collections.abc import Mapping
from typing import Optional

# ---------------------------------------------------------------- variables in a rank's environment

JOB_ID = "GAUDI_LAUNCH_JOB_ID"  # the job's id: its private directory, the ranks' watch, TORCHELASTIC_RUN_ID
# Random per job, a job variable like any other (never on argv): the last part of the name of the directory each
# rank makes on its host (path_for). The job id is shown first (the ssh control directory in /tmp, srun's argv), so
# a name made from it alone could be made first by another user of a rank's host.
JOB_DIR_SUFFIX = "GAUDI_LAUNCH_JOB_DIR_SUFFIX"
GRACE = "GAUDI_LAUNCH_GRACE"  # seconds between SIGTERM and SIGKILL (the ranks' watchdog)
DEVICE = "GAUDI_LAUNCH_DEVICE"  # hpu, cuda or cpu: --device, for the bootstrap and the runtime
RANKS_FROM = "GAUDI_LAUNCH_RANKS_FROM"  # "slurm": the bootstrap reads the rank layout from srun's variables
SYSFS = "GAUDI_LAUNCH_SYSFS"  # where the bootstrap reads the host's cards (tests point it at a copy)
CPU_BIND = "GAUDI_LAUNCH_CPU_BIND"  # "none": ranks are not bound (--cpu-bind none)
# The cards the pre-flight (or the local / srun probe) found on each host, by hostname: what a rank binds its
# CPUs from without running hl-smi again (plan/gaudi.py carry_cards / carried_cards). A job variable, never on argv.
HOST_CARDS = "GAUDI_LAUNCH_HOST_CARDS"
# Selected slots of every node, '0,1;1,3' (node 0 takes slots 0,1, node 1 slots 1,3): one command
# (mpirun, deepspeed) starts every node, so each node's part travels in one variable.
NODE_DEVICES = "GAUDI_LAUNCH_NODE_DEVICES"
NODE_SIZES = "GAUDI_LAUNCH_NODE_SIZES"  # ranks per node, when the nodes differ
HEARTBEAT_DIR = "GAUDI_LAUNCH_HEARTBEAT_DIR"  # --hang-timeout: the ranks' private heartbeat directory
RESTART_COUNT = "GAUDI_LAUNCH_RESTART_COUNT"  # --max-restarts: which attempt (0: the first run)
MAX_RESTARTS_VAR = "GAUDI_LAUNCH_MAX_RESTARTS"
COLLECTIVE = "GAUDI_LAUNCH_COLLECTIVE"  # the collective check's settings (JSON), for its ranks
# The collective check's per-check random token (a job variable, never on argv): its rendezvous admits only
# agents that prove they hold it (runtime/link_check.py).
COLLECTIVE_TOKEN = "GAUDI_LAUNCH_COLLECTIVE_TOKEN"
# Variables a user sets for the launcher itself, not for ranks.
COLLECTIVE_STEP_TIMEOUT = "GAUDI_LAUNCH_COLLECTIVE_STEP_TIMEOUT"
COLLECTIVE_LIBRARY = "GAUDI_LAUNCH_COLLECTIVE_LIBRARY"  # "1": the check runs gloo's stage on a CPU too
COLLECTIVE_SIZE = "GAUDI_LAUNCH_COLLECTIVE_SIZE"  # "BYTES,LOOPS" of each pair's all-reduce (default 32m,1000)
SSH_SHARE = "GAUDI_LAUNCH_SSH_SHARE"  # "0": no shared ssh connections
TREE_RADIX = "GAUDI_LAUNCH_TREE_RADIX"  # the radix of OpenMPI's daemon tree under --fan-out tree (plan/fanoutmode.py)
TREE_PASSES = (
    "GAUDI_LAUNCH_TREE_PASSES"  # 3: the three-pass tree (probe, job, sweep); else one pass (remote/onepass.py)
)
# The one-pass tree's gate (process/gate.py): where the launcher listens (host:port), its per-job key (hex: a
# secret, never on argv), the probe's arguments (JSON), set once a rank passed it (a re-exec does not wait again)
GATE = "GAUDI_LAUNCH_GATE"
GATE_KEY = "GAUDI_LAUNCH_GATE_KEY"
GATE_PROBE = "GAUDI_LAUNCH_GATE_PROBE"
GATE_PASSED = "GAUDI_LAUNCH_GATE_PASSED"
SWEEP_OWN_UTS = "GAUDI_LAUNCH_SWEEP_OWN_UTS"  # a sweep run in a rank: its own UTS namespace only (teardown.KILL_CODE)
DEBUG = "GAUDI_LAUNCH_DEBUG"  # tracebacks instead of one-line errors
COMPLETE = "GAUDI_LAUNCH_COMPLETE"  # shell completion's request


def node_var(name: str) -> str:
    """Per-node physical ids for one visibility variable, when the ranks inherit a restriction."""
    return f"GAUDI_LAUNCH_NODE_{name}"


# ---------------------------------------------------------------- what a rank writes on its stderr
# - An error record: ERROR_MARKER + one JSON object (rank, host, exit code, exception, traceback) on one
#   line, written by the rank bootstrap when the script fails (read by process/supervise.py).
# - TORN_DOWN: the rank was stopped by the job's teardown, not failing on its own (process/relay.py).
# - STARTED + the rank, its machine (hostname@address it reaches the master from) and the process group it
#   leads: the rank bootstrap runs (the start-up deadline, --start-timeout, counts these; process/placement.py
#   checks the machines; the job-end sweep on that host ties what is left in the group to the job).
# - COLLECTIVE_MARKER + JSON: a collective check rank's findings on its stdout (runtime/collective_check.py).
# And what the launcher tells the rank bootstrap on its command line: NO_PYTHON_FLAG first means the
# program is an executable (--no_python), run as the bootstrap's child; the job file's path and digest.

ERROR_MARKER = "@@gaudi-launch-error-record@@ "
TORN_DOWN = "@@gaudi-launch-torn-down@@"
STARTED = "@@gaudi-launch-started@@ "
NO_PYTHON_FLAG = "--gaudi-launch-no-python"
# A job file (remote/jobdir.py) instead of values on the bootstrap's argv: `ps` shows argv to every user.
JOB_FILE_FLAG = "--job-file="
JOB_DIGEST_FLAG = "--job-sha256="
COLLECTIVE_MARKER = COLLECTIVE + " "


def record_line(record: dict) -> str:
    return ERROR_MARKER + json.dumps(record) + "\n"


def parse_record(text: str) -> Optional[dict]:
    """The record after the marker, or None when it is not a JSON object (a truncated line)."""
    try:
        record = json.loads(text)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


# ---------------------------------------------------------------- restarts


def restart_count(environ) -> int:
    """Which restart this rank belongs to (0: the first run), from our variable or torchrun's. Pure."""
    for name in (RESTART_COUNT, "TORCHELASTIC_RESTART_COUNT"):
        value = str(environ.get(name, "")).strip()
        if value.isdigit():
            return int(value)
    return 0


# ---------------------------------------------------------------- a job's private files
# ``$TMPDIR/gaudi-launch-<id>``, 0700: the job directory (remote/jobdir.py) and the heartbeat directory
# (process/hangs.py) alike. Both sides refuse one that is not a real directory of this user's alone.

PREFIX = "gaudi-launch-"


class JobDirError(ValueError):
    """The per-job directory or file is not what this job created: refuse to use it."""


def path_for(job_id: str, tmp: Optional[str] = None, suffix: str = "") -> str:
    """``$TMPDIR/gaudi-launch-<id>``, or ``...-<id>-<suffix>`` (a rank's, JOB_DIR_SUFFIX: hex only, else ignored)."""
    name = PREFIX + job_id + (f"-{suffix}" if suffix and all(c in "0123456789abcdef" for c in suffix) else "")
    return os.path.join(tmp or tempfile.gettempdir(), name)


def rank_dir(job_id: str, environ: Mapping[str, str]) -> str:
    """A rank's job directory on its host: named after the public job id and the launcher's private random suffix
    (JOB_DIR_SUFFIX in the rank's environment), so no other user can make it first; the id alone without one."""
    return path_for(job_id, suffix=environ.get(JOB_DIR_SUFFIX, ""))


def private_rank_dir(job_id: str, environ: Mapping[str, str]) -> str:
    """``rank_dir``, made 0700 if absent; JobDirError for one that is not ours and private."""
    path = rank_dir(job_id, environ)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        check_private_dir(path)
    return path


def check_private_dir(path: str) -> None:
    """An existing directory is usable only if it is a real directory of ours that nobody else can enter."""
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise JobDirError(f"{path} exists and is not a directory")
    if st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise JobDirError(
            f"{path} belongs to uid {st.st_uid} with mode {stat.S_IMODE(st.st_mode):o}, not to this user with mode 700"
        )


def write_private(path: str, data: bytes) -> None:
    """A new file only this user can read; never follows a link, never overwrites."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


# ---------------------------------------------------------------- heartbeats (--hang-timeout)
# A rank touches ``rank-N.beat`` in HEARTBEAT_DIR once per step (our Trainer does; a plain script calls
# ``gaudi_launch.heartbeat()``): the launcher reads the files' times (process/hangs.py), so a beat is one
# ``utime`` call and costs nothing next to a training step.

_beat_name: Optional[str] = None
_beat_dir: Optional[int] = None  # the heartbeat directory, opened once it was found ours and private
_state = 0  # 0: not looked yet; 1: beating; -1: off (no directory, or it cannot be written)


def rank_file(directory: str, rank: str, kind: str) -> str:
    return os.path.join(directory, f"rank-{rank}.{kind}")


def dir_problem(st: os.stat_result, uid: int) -> Optional[str]:
    """Why a directory with status ``st`` may not hold user ``uid``'s heartbeats, or None. Pure.

    The launcher made it 0700 (jobdir.create); anything else was made by someone else, first: a name
    seen in the launcher host's /tmp, made on a rank's host by another user who may plant links in it."""
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    if st.st_uid != uid or st.st_mode & 0o077:
        return f"belongs to uid {st.st_uid} with mode {stat.S_IMODE(st.st_mode):o}, not to this user with mode 700"
    return None


def open_private_dir(directory: str) -> int:
    """A descriptor of ``directory`` (never through a link), only when it is ours and private:
    files are then made relative to it, so it cannot be swapped after the check. ValueError saying why not."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        known = {errno.ELOOP: "is a symbolic link", errno.ENOTDIR: "is not a directory"}
        why = known.get(exc.errno or 0) or exc.strerror or str(exc)
        raise ValueError(f"{directory} {why}") from None
    problem = dir_problem(os.fstat(fd), os.geteuid())
    if problem:
        os.close(fd)
        raise ValueError(f"{directory} {problem}")
    return fd


def create_private(name: str, dir_fd: int, exclusive: bool = False) -> int:
    """A file of ours in the heartbeat directory, 0600; never through a link."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_EXCL if exclusive else os.O_TRUNC)
    return os.open(name, flags, 0o600, dir_fd=dir_fd)


def beat() -> None:
    """This rank advanced. Silent and free when the launcher does not watch for hangs."""
    global _beat_name, _beat_dir, _state
    if _state < 0:
        return
    if _state == 0:
        directory, rank = os.environ.get(HEARTBEAT_DIR), os.environ.get("RANK", "")
        if not directory or not rank.isdigit():
            _state = -1
            return
        try:  # e.g. a rank on another host, where the launcher's directory is not (or is someone else's)
            _beat_dir = open_private_dir(directory)
        except ValueError:
            _state = -1
            return
        _beat_name, _state = f"rank-{rank}.beat", 1
    assert _beat_name is not None and _beat_dir is not None  # set with _state = 1
    try:
        os.utime(_beat_name, dir_fd=_beat_dir, follow_symlinks=False)
    except FileNotFoundError:
        try:  # the first beat of this rank
            os.close(create_private(_beat_name, _beat_dir))
        except OSError:
            _state = -1
    except OSError:
        _state = -1
