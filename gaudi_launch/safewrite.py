"""Writing a file into a directory another user may write to (a shared log, output or working directory),
so that a link or file they planted at its name is never written through.

The launcher often runs as root, and the runtime writes fixed names (``collective-check.json``,
``metrics.jsonl``, ``results.json``): with ``open(path, "w")`` a planted ``results.json -> /etc/passwd``
truncates the link's target. Two ways, one per kind of file:

* :func:`write_whole` for a file written in one go: a new temporary file beside it (``O_EXCL``, never a
  link), renamed over the name, so whatever was planted there is replaced, not followed;
* :func:`open_own` for a file written as it goes (a log, ``metrics.jsonl``): opened without following a
  link and used only if it is a plain file of this user with one link (a hard link to another file would
  let us truncate that file), truncated only after that check.

A root helper: imports nothing of gaudi_launch, so the ranks' runtime may use it too. Every writer of the
package goes through here (tests/unit/test_safe_writers.py keeps it so).
"""

from __future__ import annotations

import os
import stat
import tempfile
from typing import IO, BinaryIO, Callable, Optional, Union

__all__ = ["write_whole", "open_own", "NotOurFile"]


class NotOurFile(OSError):
    """The name holds something other than a plain file of this user with one link: not written."""


def _default_mode() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask  # what open() would have given


def write_whole(
    path: Union[str, os.PathLike],
    data: Union[bytes, str, Callable[[BinaryIO], object]],
    *,
    mode: Optional[int] = None,
) -> None:
    """Write ``data`` to ``path`` through a new temporary file in the same directory renamed over it.

    ``data``: bytes, text (UTF-8), or a function that writes into the binary file it is given (a plot's
    ``savefig``). ``mode``: the file's permissions (default: what ``open()`` gives under the umask). A link or file
    another user planted at ``path`` is replaced, never followed; a reader sees the old file or the new
    one, whole. The directory itself is the caller's choice (rename cannot leave it)."""
    path = os.fspath(path)
    directory = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", dir=directory)  # O_EXCL, 0600
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), _default_mode() if mode is None else mode)
            if callable(data):
                data(f)
            else:
                f.write(data.encode("utf-8") if isinstance(data, str) else data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def open_own(
    path: Union[str, os.PathLike],
    *,
    append: bool = False,
    binary: bool = False,
    mode: int = 0o600,
    dir_fd: Optional[int] = None,
) -> IO:
    """Open ``path`` for writing (from the start, or at its end with ``append``), created with ``mode``
    when new; relative to the directory descriptor ``dir_fd`` when given (a directory checked once, that
    cannot be swapped afterwards). Never through a link (``O_NOFOLLOW``); :class:`NotOurFile` if the name
    holds anything but a plain file of this user with one link. Text files are UTF-8."""
    path = os.fspath(path)
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | (os.O_APPEND if append else 0)
    fd = os.open(path, flags, mode, dir_fd=dir_fd)  # O_NONBLOCK: a FIFO planted at the name does not hang the open
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_nlink != 1:
            raise NotOurFile(f"{path} is not a plain file of this user with one link: not written")
        os.set_blocking(fd, True)
        if not append:
            os.ftruncate(fd, 0)  # only now: truncating through a hard link would destroy another file
        return (
            os.fdopen(fd, "ab" if append else "wb")
            if binary
            else os.fdopen(fd, "a" if append else "w", encoding="utf-8")
        )
    except BaseException:
        os.close(fd)
        raise
