"""Splitting output into finished lines and carriage-return progress states (gaudi_launch/process/progress.py)."""

from gaudi_launch.process.progress import LineSplitter, ProgressPace


def pieces(*chunks: bytes):
    s = LineSplitter()
    out = []
    for c in chunks:
        out += s.feed(c)
    return out + s.close()


def test_a_progress_bar_gives_each_state_then_its_last_state_as_the_line():
    assert pieces(b"\r 10%|#", b"\r 50%|####\r100%|########", b"\n") == [
        (" 10%|#", False),
        (" 50%|####", False),
        ("100%|########", False),
        ("100%|########", True),
    ]
    # a state, then a bare newline: the line is that state
    assert pieces(b"\r 50%|####\r", b"x\r\n") == [(" 50%|####", False), ("x", True)]
    assert pieces(b"\r 50%|####\r", b"\n") == [(" 50%|####", True)]  # "\r\n" split across reads


def test_plain_lines_crlf_and_a_split_crlf():
    assert pieces(b"a\nb\r\nc\r", b"\nd") == [("a", True), ("b", True), ("c", True), ("d", True)]


def test_text_after_states_is_the_line_and_an_unfinished_state_is_kept_at_the_end():
    assert pieces(b"\rstep 1\rdone\n") == [("step 1", False), ("done", True)]
    assert pieces(b"plain", b" line\n") == [("plain line", True)]  # no "\r": nothing before the line ends
    assert pieces(b"\rstep 1") == [("step 1", False), ("step 1", True)]
    assert pieces(b"") == []


def test_a_line_without_end_is_handed_out_in_pieces():
    s = LineSplitter(max_line=4)
    assert s.feed(b"abcdef") == [("abcdef", True)]


def test_a_non_terminal_gets_the_first_state_then_the_newest_every_few_seconds():
    pace = ProgressPace(every=3.0)
    shown = [pace.offer(f"{i}%", now=i / 10) for i in range(100)]  # 100 states in 10 s
    assert [s for s in shown if s] == ["0%", "30%", "60%", "90%"]
    assert pace.pending == "99%" and abs(pace.wait(now=9.9) - 2.1) < 1e-9  # shown at 9.0


def test_a_stalled_bar_shows_its_last_state_when_due_and_a_finished_line_starts_a_new_bar():
    pace = ProgressPace(every=3.0)
    assert pace.offer("1/9", now=0.0) == "1/9"
    assert pace.offer("2/9", now=0.5) is None and pace.offer("3/9", now=1.0) is None
    assert pace.due(now=2.9) is None and pace.wait(now=2.0) == 1.0
    assert pace.due(now=3.0) == "3/9" and pace.wait(now=3.0) is None and pace.due(now=99) is None
    pace.done()  # the line ended: the next bar's first state goes at once
    assert pace.offer("a", now=3.1) == "a"
