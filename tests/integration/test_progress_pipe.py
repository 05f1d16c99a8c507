"""Progress bars through a pipe (`gaudi-launch ... | tee train.log`): a rank's \\r states reach a
non-terminal as lines of their own, a few, before the bar ends (process/progress.py ProgressPace),
also from the deepspeed backend's ranks, whose relay paces them (process/relay.py)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

BAR = """
import os, sys, time
for i in range(1, 51):
    sys.stdout.write(f"\\rstep {i}/400"); sys.stdout.flush(); time.sleep(0.001)
deadline = time.time() + 90
while not os.path.exists(sys.argv[1]):  # the bar stalls at 50 until the launcher's reader has seen that state
    assert time.time() < deadline, "the launcher never showed step 50"
    time.sleep(0.05)
for i in range(51, 401):
    sys.stdout.write(f"\\rstep {i}/400"); sys.stdout.flush(); time.sleep(0.001)
sys.stdout.write("\\n"); print("done", flush=True)
"""


@pytest.mark.parametrize("backend", ["local", "deepspeed"])
def test_progress_states_reach_a_pipe_before_the_bar_ends_and_only_a_few(tmp_path, backend):
    script, go = tmp_path / "bar.py", tmp_path / "go"
    script.write_text(BAR)
    argv = [sys.executable, "-m", "gaudi_launch", "--backend", backend, "--num_devices", "1", "--log-dir", "logs"]
    argv += [str(script), str(go)]
    with open(tmp_path / "err", "w") as err:
        proc = subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.PIPE, stderr=err, text=True)
    lines, deadline = [], time.monotonic() + 120
    try:
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if line.startswith("[rank 0] step 50/400"):  # the stalled bar's last state, before the line ends
                go.write_text("")
            assert time.monotonic() < deadline, lines
    finally:
        proc.stdout.close()
        code = proc.wait(timeout=60)
    assert code == 0, (tmp_path / "err").read_text()
    states = [s[len("[rank 0] ") :] for s in lines if s.startswith("[rank 0] step")]
    # 400 states written: the first at once, the stalled one when due, the last as the finished line
    assert states[:2] == ["step 1/400", "step 50/400"] and states[-1] == "step 400/400", lines
    assert len(states) <= 4, lines
    assert lines.index("[rank 0] done") > lines.index("[rank 0] step 400/400")
    assert (tmp_path / "logs" / "rank-0.log").read_text() == "step 400/400\ndone\n"  # logs keep the finished line
