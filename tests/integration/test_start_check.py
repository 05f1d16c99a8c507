"""Hooks.start_check with real processes: while ranks are starting, the backend's check is asked with the
hosts where a rank started; its message ends the launch as a launch failure (exit 127), the job torn down."""

from __future__ import annotations

import io
import os
import sys

from gaudi_launch.process.supervise import Hooks, ProcSpec, Supervisor
from tests.helpers import all_gone


def test_a_start_checks_message_ends_the_launch_as_a_launch_failure():
    asked = []

    def check(started_hosts):
        asked.append(set(started_hosts))
        return "the daemon on h1 died" if len(asked) >= 2 else None

    # a launcher of two ranks that never starts them (as mpirun waiting for a daemon that died)
    launcher = ProcSpec(
        rank=0,
        host="h0",
        argv=[sys.executable, "-c", "import os, time; print(os.getpid(), flush=True); time.sleep(600)"],
        env=dict(os.environ),
        label="launcher",
        ranks={0: "h0", 1: "h1"},
    )
    out, err = io.StringIO(), io.StringIO()
    result = Supervisor(
        [launcher], Hooks(start_check=check), grace=2, stdout=out, stderr=err, color=False, handle_signals=False
    ).run()
    assert result.exit_code == 127, err.getvalue()
    assert result.not_started == "the daemon on h1 died"
    assert "first failure: the daemon on h1 died" in err.getvalue()
    assert asked == [set(), set()]  # no rank had started anywhere
    assert all_gone([int(out.getvalue().split()[-1])], timeout=10)
