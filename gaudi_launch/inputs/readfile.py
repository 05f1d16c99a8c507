"""Reading a file the user named (hostfile, job file, env file, ssh config, --exclude-from, report inputs) so
that no path can hang or exhaust the launcher: a FIFO without a writer, /dev/zero, a terminal.

The open is non-blocking (opening a FIFO waits for a writer otherwise), the descriptor must be a regular file
(checked on the descriptor, not the name), and at most ``limit + 1`` bytes are read, so the caller can tell
"too large" from "just fits". Errors are OSErrors (FileNotFoundError, IsADirectoryError, PermissionError,
:class:`NotRegularFile`), which each caller turns into its own message naming the file.
"""

from __future__ import annotations

import errno
import os
import stat

from gaudi_launch.errors import UserError

__all__ = ["NotRegularFile", "check_input", "read_bounded", "read_regular", "kind_of"]


MAX_INPUT_BYTES = 1 << 20  # a hostfile, job file, env file or ssh config is a few kilobytes


class NotRegularFile(OSError):
    """A FIFO, device or socket where a file was expected (strerror says which)."""


def kind_of(mode: int) -> str:
    """'a FIFO', 'a character device', ... for a file's st_mode. Pure."""
    for test, name in (
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISDIR, "a directory"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def read_bounded(path: str, limit: int) -> bytes:
    """At most ``limit + 1`` bytes of the regular file ``path``; never blocks on the open.

    IsADirectoryError for a directory, :class:`NotRegularFile` for anything else that is not a plain file."""
    return read_regular(path, limit)[0]


def read_regular(path: str, limit: int) -> tuple[bytes, os.stat_result]:
    """:func:`read_bounded`, and the status of the file read (of the descriptor: the file whose bytes these are)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0))
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(errno.EISDIR, "is a directory, not a file", path)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(errno.EINVAL, f"is {kind_of(st.st_mode)}, not a regular file", path)
        os.set_blocking(fd, True)
        chunks, left = [], limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks), st
    finally:
        os.close(fd)


def check_input(path: str, limit: int, *, where: str, what: str) -> None:
    """A UserError (exit 2, naming ``where``) when ``path`` is there but not a readable regular file of at most
    ``limit`` bytes: for a file another program reads later (ssh -F) or a later step reads (--exclude-from)."""
    try:
        data = read_bounded(path, limit)
    except FileNotFoundError:
        return  # said where it is read (ssh -F, the finding): as before
    except OSError as exc:
        raise UserError(
            f"{what} {path} cannot be read: {exc.strerror or exc}", where=where, hint=f"give the {what} itself"
        ) from None
    if len(data) > limit:
        raise UserError(f"{what} {path} is larger than {limit >> 20} MiB", where=where, hint=f"give the {what} itself")
