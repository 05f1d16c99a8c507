"""Splitting a rank's output into lines and carriage-return progress states (tqdm bars). Pure.

A progress bar rewrites its line with ``\\r`` and ends it with ``\\n`` only when done, so reading
whole lines would show nothing until the loop ends. The splitter hands out each state as it comes
(``final=False``) and each finished line (``final=True``); a finished line is its last state, which
is what logs and failure summaries keep. ``\\r\\n`` is a line end.
"""

from __future__ import annotations

from typing import Callable, Optional

Piece = tuple[str, bool]  # (text, final)


class LineSplitter:
    """``hold``: how many bytes at the end of a too-long line's piece to keep for the next piece (the start
    of a secret cut off by the split: envfile.straddling), so that a secret is masked whole."""

    def __init__(self, max_line: int = 1 << 20, hold: Optional[Callable[[bytes], int]] = None):
        self.max_line = max_line
        self.hold = hold
        self._buf = b""
        self._state: Optional[str] = None  # the last progress state of the unfinished line
        self._rewriting = False  # the unfinished line has been rewound with "\r" (a progress bar)

    def feed(self, data: bytes) -> list[Piece]:
        self._buf += data
        out: list[Piece] = []
        while True:
            cut = [i for i in (self._buf.find(b"\n"), self._buf.find(b"\r")) if i >= 0]
            if not cut:
                if len(self._buf) >= self.max_line:  # a line without an end: hand it out in pieces
                    kept = min(self.hold(self._buf), len(self._buf) // 2) if self.hold else 0
                    out.append(self._final(self._take(len(self._buf) - kept)))
                elif self._rewriting and self._buf:
                    # a bar writes "\r" first, then its state: show the state now, not at the next "\r"
                    text = self._buf.decode("utf-8", errors="replace")
                    if text != self._state:
                        self._state = text
                        out.append((text, False))
                return out
            i = min(cut)
            if self._buf[i : i + 1] == b"\r":
                if i + 1 == len(self._buf):
                    return out  # "\r" last: wait to see whether "\n" follows
                if self._buf[i + 1 : i + 2] == b"\n":
                    out.append(self._final(self._take(i, skip=2)))
                    continue
                text = self._take(i, skip=1)
                self._rewriting = True
                if text and text != self._state:
                    self._state = text
                    out.append((text, False))
                continue
            out.append(self._final(self._take(i, skip=1)))

    def close(self) -> list[Piece]:
        rest = self._buf.rstrip(b"\r")
        self._buf = b""
        if rest or self._state is not None:
            return [self._final(rest.decode("utf-8", errors="replace"))]
        return []

    def _take(self, n: int, skip: int = 0) -> str:
        text, self._buf = self._buf[:n], self._buf[n + skip :]
        return text.decode("utf-8", errors="replace")

    def _final(self, text: str) -> Piece:
        if not text and self._state is not None:
            text = self._state  # "...\rlast state\r\n": the line is its last state
        self._state, self._rewriting = None, False
        return text, True


PROGRESS_EVERY = 3.0  # seconds between a rank's progress states written to a non-terminal (a pipe, a file)


class ProgressPace:
    """Which progress states of one stream go to a non-terminal, where each one is a line of its own:
    a bar's first state at once, then at most one every ``every`` seconds, the newest; a state held
    back is shown when its time comes even if the bar stops moving (``due``), so a log shows where a
    stalled loop stands. A finished line (the bar's last state) ends the bar: ``done``. Pure: the
    caller passes the clock."""

    def __init__(self, every: float = PROGRESS_EVERY):
        self.every = every
        self._shown: Optional[float] = None  # when this bar's last state was shown
        self.pending: Optional[str] = None  # the newest state not shown yet

    def offer(self, text: str, now: float) -> Optional[str]:
        """A new state: the text to show now, or None (held back as ``pending``)."""
        self.pending = text
        return self.due(now)

    def due(self, now: float) -> Optional[str]:
        """The held-back state when its time has come, else None."""
        if self.pending is None or (self._shown is not None and now - self._shown < self.every):
            return None
        text, self.pending, self._shown = self.pending, None, now
        return text

    def wait(self, now: float) -> Optional[float]:
        """Seconds until the held-back state is due; None when nothing is held back."""
        if self.pending is None:
            return None
        return 0.0 if self._shown is None else max(0.0, self._shown + self.every - now)

    def done(self) -> None:
        self._shown = self.pending = None
