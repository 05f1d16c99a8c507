"""``python -m gaudi_launch.backends.ds_runner ARGS``: DeepSpeed's runner (``deepspeed ARGS``) without its kill handler.

On SIGINT/SIGTERM DeepSpeed's pdsh runner runs ``pdsh ... pkill -f "cd <cwd>; python -u -m
deepspeed.launcher.launch"`` on every host, which kills every job started from the same directory
with the same Python, other users' included. Its handler is never installed here. Instead a signal
(the launcher's death arrives as SIGTERM, the parent-death signal) kills this process's own
descendants (runner, pdsh, its ssh clients), nothing else: the remote ranks see their output pipe close and end
themselves (the worker's watchdog), and the launcher's own teardown is job-scoped.
Runs in the ranks' interpreter, never in the launcher's process (which must not import DeepSpeed).
"""

from __future__ import annotations

import os
import signal
import sys
import types


def descendants(root: int) -> list:
    """Every process below ``root`` (pdsh puts each ssh client in a session of its own, so our process
    group alone does not hold them)."""
    children: dict = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(pid))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


_LAUNCHER = os.getppid()


def _kill_own_tree(_signum, _frame) -> None:
    if os.getppid() == _LAUNCHER:
        return  # the launcher lives: its job-scoped teardown (SIGTERM, grace, SIGKILL) is under way
    for pid in descendants(os.getpid()):  # collected first: a killed parent's children get reparented
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    os.killpg(os.getpgrp(), signal.SIGKILL)


def _without_handlers(module: types.ModuleType) -> types.SimpleNamespace:
    """The `signal` module as DeepSpeed's runner sees it: installing a handler does nothing."""
    names = {k: getattr(module, k) for k in dir(module) if not k.startswith("__")}
    names["signal"] = lambda *_args: None
    return types.SimpleNamespace(**names)


def main(argv) -> None:
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _kill_own_tree)
    from deepspeed.launcher import runner

    runner.signal = _without_handlers(signal)
    sys.argv = ["deepspeed", *argv]
    runner.main()


if __name__ == "__main__":
    main(sys.argv[1:])
