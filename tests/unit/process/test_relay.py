"""The deepspeed backend's rank relay (relay.py) and the worker's --local_rank handling: pure parts
(issue 10 items 3 and 10). The relay on real processes: tests/integration/test_deepspeed_backend.py."""

from __future__ import annotations

from gaudi_launch.process import relay
from gaudi_launch.process.worker import take_local_rank


def test_lines_are_whole_and_the_rest_waits_for_its_newline():
    assert relay.lines(b"a\nb\r\nc") == ([b"a\n", b"b\r\n"], b"c")
    assert relay.lines(b"c", final=True) == ([b"c\n"], b"")
    assert relay.lines(b"") == ([], b"")
    long = b"x" * (relay.LINE_MAX + 5)
    out, rest = relay.lines(long)
    assert out == [b"x" * relay.LINE_MAX + b"\n"] and rest == b"xxxxx"


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
