"""The rank side of hang detection (--hang-timeout): heartbeats, and stacks on request.

The launcher gives each rank a private directory in GAUDI_LAUNCH_HEARTBEAT_DIR (the environment,
never stdout, which is the user's). A rank touches ``rank-N.beat`` there once per step (our
Trainer does; a plain script calls ``gaudi_launch.heartbeat()``): the launcher reads the files'
times, so a beat is one ``utime`` call and costs nothing next to a training step. The bootstrap
(worker.py) also registers faulthandler on DUMP_SIGNAL, writing every thread's Python stack to
``rank-N.stack``, and records its pid in ``rank-N.pid``, for the launcher to ask for the stacks
when no rank advanced for --hang-timeout seconds. Stdlib only: plain scripts import this.
"""

from __future__ import annotations

import errno
import os
import signal
import socket
import stat
import sys
from collections.abc import Mapping
from typing import Optional

HEARTBEAT_DIR = "GAUDI_LAUNCH_HEARTBEAT_DIR"
# SIGUSR2, not SIGUSR1: Slurm's --signal and Lightning's pre-emption handling use USR1, and a
# stack dump must never trigger a user's own handler.
DUMP_SIGNAL = signal.SIGUSR2

_beat_name: Optional[str] = None
_beat_dir: Optional[int] = None  # the heartbeat directory, opened once it was found ours and private
_state = 0  # 0: not looked yet; 1: beating; -1: off (no directory, or it cannot be written)
_stack_file = None  # kept open for faulthandler, which writes into its descriptor from a signal handler


def start_time(pid: int) -> int:
    """A process's start time in clock ticks since boot (0 when unknown): with the pid, its identity."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return 0


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


def _create(name: str, dir_fd: int, exclusive: bool = False) -> int:
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
            os.close(_create(_beat_name, _beat_dir))
        except OSError:
            _state = -1
    except OSError:
        _state = -1


def install_stack_dump(environ: Mapping[str, str]) -> bool:
    """In the bootstrap: stacks to rank-N.stack on DUMP_SIGNAL, this pid in rank-N.pid (with the host
    and the process's start time, so that the launcher never signals another process given this pid).
    Only into the launcher's own private directory: a directory of that name that is not ours and
    private is left alone, and said so."""
    global _stack_file
    directory, rank = environ.get(HEARTBEAT_DIR), environ.get("RANK", "")
    if not directory or not rank.isdigit() or not os.path.lexists(directory):
        return False  # not watched, or a host other than the launcher's: no stacks from here
    try:
        dir_fd = open_private_dir(directory)
    except ValueError as exc:
        print(f"gaudi-launch: rank {rank}: {exc}: no stacks or heartbeats written there", file=sys.stderr)
        return False
    import faulthandler

    try:
        _stack_file = os.fdopen(_create(f"rank-{rank}.stack", dir_fd), "w")
        faulthandler.register(DUMP_SIGNAL, file=_stack_file, all_threads=True, chain=False)
        tmp = f"rank-{rank}.pid.{os.getpid()}"
        try:
            os.unlink(tmp, dir_fd=dir_fd)  # left by an earlier process with this pid
        except FileNotFoundError:
            pass
        with os.fdopen(_create(tmp, dir_fd, exclusive=True), "w") as f:
            f.write(f"{socket.gethostname()} {os.getpid()} {start_time(os.getpid())}\n")
        os.replace(tmp, f"rank-{rank}.pid", src_dir_fd=dir_fd, dst_dir_fd=dir_fd)  # whole, or not there
    except OSError:
        return False
    finally:
        os.close(dir_fd)
    return True
