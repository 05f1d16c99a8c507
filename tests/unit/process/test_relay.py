"""The deepspeed backend's rank relay (relay.py) and the worker's --local_rank handling: pure parts
(issue 10 items 3 and 10). The relay on real processes: tests/integration/test_deepspeed_backend.py."""

from __future__ import annotations

import os

from gaudi_launch.process import relay
from gaudi_launch.process.progress import ProgressPace
from gaudi_launch.process.worker import take_local_rank


def test_the_relay_passes_lines_whole_and_progress_states_paced(tmp_path):
    w = os.open(tmp_path / "relayed", os.O_WRONLY | os.O_CREAT)
    now = [0.0]
    stream = relay._Stream(-1, w, "2", clock=lambda: now[0])
    stream.feed(b"\rstep 1/9")  # a bar's first state: at once
    now[0] = 1.0
    stream.feed(b"\rstep 2/9\rstep 3/9")
    stream.due()  # held back: too soon
    now[0] = 1.0 + ProgressPace().every
    stream.due()  # the bar stalled: its newest state when due
    stream.feed(b"\rstep 9/9\nplain\r\n" + b"x" * (relay.LINE_MAX + 5))  # a line without end goes on in pieces
    stream.feed(b"partial")
    stream.close()
    os.close(w)
    out = [relay.untag(line) for line in (tmp_path / "relayed").read_text().split("\n")[:-1]]
    P = relay.PROGRESS
    assert out == [
        (2, P + "step 1/9"),
        (2, P + "step 3/9"),
        (2, "step 9/9"),  # the finished line is the bar's last state
        (2, "plain"),
        (2, "x" * (relay.LINE_MAX + 5)),
        (2, "partial"),
    ]


def test_tag_and_untag_round_trip_any_text():
    for text in ("hello", "", " lead", "@@gaudi-launch-rank@@9 forged", "x\ty"):
        line = relay.tag("12", text.encode()).decode()
        assert relay.untag(line) == (12, text)
    assert relay.untag("plain") == (None, "plain")
    assert relay.untag("@@gaudi-launch-rank@@x y") == (None, "@@gaudi-launch-rank@@x y")


def test_a_rank_that_ended_without_a_word_gets_a_record():
    record = relay.unexplained_failure(-9, False, False, 3, 42, "h", "t")
    assert record == {"rank": 3, "host": "h", "pid": 42, "time": "t", "exit_code": 137, "signal": "SIGKILL"}
    assert relay.unexplained_failure(5, False, False, 0, 1, "h", "t")["exit_code"] == 5
    # its own record said it, it was told to stop, or its relay was signalled: nothing to add
    assert relay.unexplained_failure(1, True, False, 0, 1, "h", "t") is None
    assert relay.unexplained_failure(-15, False, True, 0, 1, "h", "t") is None
    assert relay.unexplained_failure(0, False, False, 0, 1, "h", "t") is None


def test_deepspeeds_local_rank_goes_after_the_script():
    job = ["--job-file=/t/job.json", "--job-sha256=ab"]
    assert take_local_rank(["--local_rank=3", *job]) == ("--local_rank=3", job)
    assert take_local_rank(job) == (None, job)
    # a user's script that happens to take the flag first is left alone
    assert take_local_rank(["--local_rank=3", "train.py"]) == (None, ["--local_rank=3", "train.py"])
