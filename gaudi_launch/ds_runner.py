"""``python -m gaudi_launch.ds_runner ARGS``: DeepSpeed's runner (``deepspeed ARGS``) without its kill handler.

On SIGINT/SIGTERM DeepSpeed's pdsh runner runs ``pdsh ... pkill -f "cd <cwd>; python -u -m
deepspeed.launcher.launch"`` on every host, which kills every job started from the same directory
with the same Python, other users' included. Its handler is never installed here. Instead a signal
(the launcher's death arrives as SIGTERM, the parent-death signal) kills this process's own group
(runner, pdsh, ssh clients), nothing else: the remote ranks see their output pipe close and end
themselves (the worker's watchdog), and the launcher's own teardown is job-scoped.
Runs in the ranks' interpreter, never in the launcher's process (which must not import DeepSpeed).
"""
from __future__ import annotations

import os
import signal
import sys
import types


def _kill_own_group(_signum, _frame) -> None:
    os.killpg(os.getpgrp(), signal.SIGKILL)


def _without_handlers(module: types.ModuleType) -> types.SimpleNamespace:
    """The `signal` module as DeepSpeed's runner sees it: installing a handler does nothing."""
    names = {k: getattr(module, k) for k in dir(module) if not k.startswith("__")}
    names["signal"] = lambda *_args: None
    return types.SimpleNamespace(**names)


def main(argv) -> None:
    if os.getpgrp() != os.getpid():
        os.setpgid(0, 0)  # our group holds exactly the runner, pdsh and ssh of this job
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _kill_own_group)
    from deepspeed.launcher import runner

    runner.signal = _without_handlers(signal)
    sys.argv = ["deepspeed", *argv]
    runner.main()


if __name__ == "__main__":
    main(sys.argv[1:])
