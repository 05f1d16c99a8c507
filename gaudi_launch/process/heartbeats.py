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

import os
import signal
import socket
from collections.abc import Mapping
from typing import Optional

HEARTBEAT_DIR = "GAUDI_LAUNCH_HEARTBEAT_DIR"
# SIGUSR2, not SIGUSR1: Slurm's --signal and Lightning's pre-emption handling use USR1, and a
# stack dump must never trigger a user's own handler.
DUMP_SIGNAL = signal.SIGUSR2

_beat_path: Optional[str] = None
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


def beat() -> None:
    """This rank advanced. Silent and free when the launcher does not watch for hangs."""
    global _beat_path, _state
    if _state < 0:
        return
    if _state == 0:
        directory, rank = os.environ.get(HEARTBEAT_DIR), os.environ.get("RANK", "")
        if not directory or not rank.isdigit():
            _state = -1
            return
        _beat_path, _state = rank_file(directory, rank, "beat"), 1
    assert _beat_path is not None  # set with _state = 1
    try:
        os.utime(_beat_path)
    except FileNotFoundError:
        try:  # the first beat of this rank
            with open(_beat_path, "a"):
                pass
        except OSError:
            _state = -1  # e.g. a rank on another host, where the launcher's directory is not
    except OSError:
        _state = -1


def install_stack_dump(environ: Mapping[str, str]) -> bool:
    """In the bootstrap: stacks to rank-N.stack on DUMP_SIGNAL, this pid in rank-N.pid (with the host
    and the process's start time, so that the launcher never signals another process given this pid)."""
    global _stack_file
    directory, rank = environ.get(HEARTBEAT_DIR), environ.get("RANK", "")
    if not directory or not rank.isdigit() or not os.path.isdir(directory):
        return False  # not watched, or a host other than the launcher's: no stacks from here
    import faulthandler

    try:
        _stack_file = open(rank_file(directory, rank, "stack"), "w")
        faulthandler.register(DUMP_SIGNAL, file=_stack_file, all_threads=True, chain=False)
        tmp = rank_file(directory, rank, f"pid.{os.getpid()}")
        with open(tmp, "w") as f:
            f.write(f"{socket.gethostname()} {os.getpid()} {start_time(os.getpid())}\n")
        os.replace(tmp, rank_file(directory, rank, "pid"))  # whole, or not there
    except OSError:
        return False
    return True
