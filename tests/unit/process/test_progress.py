"""Splitting output into finished lines and carriage-return progress states (gaudi_launch/process/progress.py)."""

from gaudi_launch.process.progress import LineSplitter


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
