"""The launcher's exit status, in one place (README's "Exit status" table is tested against it).

Besides these, a failed job exits with its first failing rank's own code, or 128+N for a signal N.
"""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    OK = 0  # every rank exited 0
    INTERNAL = 1  # a bug of gaudi-launch (GAUDI_LAUNCH_DEBUG=1 shows the traceback)
    USAGE = 2  # bad input: options, hostfile, env file, job file, busy port
    PREFLIGHT = 3  # the pre-flight failed: nothing was started
    HOST_LOST = 4  # a host stopped answering mid-run
    HUNG = 5  # no rank advanced for --hang-timeout seconds
    CANNOT_EXECUTE = 127  # a rank's program could not be started (the shell's code for it)
    SIGNAL_BASE = 128  # + N: killed by signal N, or the launcher got signal N (130 for Ctrl-C)


def for_signal(signum: int) -> int:
    """Shell convention: a signal N becomes 128+N."""
    return ExitCode.SIGNAL_BASE + int(signum)
