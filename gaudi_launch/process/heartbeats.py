"""The rank side of hang detection (--hang-timeout): heartbeats, and stacks on request.

The launcher gives each rank a private directory in GAUDI_LAUNCH_HEARTBEAT_DIR (the environment,
never stdout, which is the user's). A rank touches ``rank-N.beat`` there once per step (the beat
itself is the wire module's, which the rank side imports alone). The bootstrap
(worker.py) also registers faulthandler on DUMP_SIGNAL, writing every thread's Python stack to
``rank-N.stack``, and records its pid in ``rank-N.pid``, for the launcher to ask for the stacks
when no rank advanced for --hang-timeout seconds. Stdlib only: the bootstrap imports this.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
from collections.abc import Mapping

from gaudi_launch.wire import HEARTBEAT_DIR, create_private, open_private_dir

# SIGUSR2, not SIGUSR1: Slurm's --signal and Lightning's pre-emption handling use USR1, and a
# stack dump must never trigger a user's own handler.
DUMP_SIGNAL = signal.SIGUSR2

_stack_file = None  # kept open for faulthandler, which writes into its descriptor from a signal handler


def start_time(pid: int) -> int:
    """A process's start time in clock ticks since boot (0 when unknown): with the pid, its identity."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return 0


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
        _stack_file = os.fdopen(create_private(f"rank-{rank}.stack", dir_fd), "w")
        faulthandler.register(DUMP_SIGNAL, file=_stack_file, all_threads=True, chain=False)
        tmp = f"rank-{rank}.pid.{os.getpid()}"
        try:
            os.unlink(tmp, dir_fd=dir_fd)  # left by an earlier process with this pid
        except FileNotFoundError:
            pass
        with os.fdopen(create_private(tmp, dir_fd, exclusive=True), "w") as f:
            f.write(f"{socket.gethostname()} {os.getpid()} {start_time(os.getpid())}\n")
        os.replace(tmp, f"rank-{rank}.pid", src_dir_fd=dir_fd, dst_dir_fd=dir_fd)  # whole, or not there
    except OSError:
        return False
    finally:
        os.close(dir_fd)
    return True
