"""Per-rank log files (--log-dir) that another user cannot turn against us.

The launcher often runs as root and writes fixed names (rank-N.log): in a directory that someone
else can write to, a planted ``rank-0.log -> /etc/...`` would be overwritten. So the directory must
be ours (or root's) and writable by nobody else, unless it is sticky and ours (others can then add
files but not replace ours); each log is opened without following a symlink, and a file that is not
a plain file of ours with one link is refused before anything is truncated.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Collection
from typing import Optional, TextIO, cast

from gaudi_launch import safewrite
from gaudi_launch.errors import UserError


def dir_problem(st: os.stat_result, uid: int, gids: Collection[int]) -> Optional[str]:
    """Why a directory with status ``st`` is unsafe for logs of user ``uid``, or None. Pure."""
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    if st.st_uid not in (uid, 0):
        return f"belongs to another user (uid {st.st_uid})"
    others = st.st_mode & stat.S_IWOTH or (st.st_mode & stat.S_IWGRP and st.st_gid not in gids)
    if others and not (st.st_mode & stat.S_ISVTX and st.st_uid == uid):
        return "can be written by other users"
    return None


def prepare_log_dir(path: str) -> None:
    """Create the log directory (private to us when new: 0700, whatever the umask) and refuse an unsafe
    existing one (whose mode is the user's choice and stays)."""
    os.close(open_log_dir(path))


_MAX_LINKS = 40  # as the kernel's ELOOP limit


def open_log_dir(path: str) -> int:
    """A descriptor of the log directory, made (0700) when new, checked on the descriptor: the files are
    then made relative to it (open_log(name, dir_fd)), so the directory checked is the one written into.

    The last component is never a link; a link on the way is followed only when this user or root owns it
    (another user's link, e.g. /tmp/x -> /root, would choose the directory a root launcher writes in).
    UserError naming --log-dir when it is not a safe directory of ours."""
    where = f"--log-dir {path}"
    try:
        try:
            os.makedirs(path, mode=0o700)
            made = True
        except FileExistsError:
            made = False
        fd = _open_dir_trusting_own_links(path)
    except _Untrusted as exc:
        raise UserError(
            f"the log directory's path goes through {exc}: it could choose where gaudi-launch writes",
            where=where,
            hint="give the real path of a directory of your own (no other user's link on the way)",
        ) from None
    except OSError as exc:
        link = exc.errno == errno.ELOOP
        raise UserError(
            "the log directory is a symbolic link (not followed)"
            if link
            else f"the log directory cannot be created or opened: {exc.strerror or exc}",
            where=where,
            hint="give the directory itself (mkdir -m 700 DIR), not a link to it"
            if link
            else "give a directory of yours, or a path where one can be made (a file may be in the way)",
        ) from None
    try:
        if made:
            os.fchmod(fd, 0o700)  # the umask may have taken bits off: still ours alone
        problem = dir_problem(os.fstat(fd), os.geteuid(), {os.getegid(), *os.getgroups()})
    except BaseException:
        os.close(fd)
        raise
    if problem:
        os.close(fd)
        raise UserError(
            f"the log directory {problem}: a planted rank-N.log link could make gaudi-launch overwrite another file",
            where=where,
            hint="use a directory of your own that only you can write to (mkdir -m 700 DIR)",
        )
    return fd


class _Untrusted(Exception):
    """A link of another user on the way to the log directory (str: which)."""


def _open_dir_trusting_own_links(path: str) -> int:
    """os.open(path, O_DIRECTORY | O_NOFOLLOW), walking component by component: a link on the way is
    followed only when its owner is this user or root; the last component may not be a link (ELOOP)."""
    uid, budget = os.geteuid(), [_MAX_LINKS]
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

    def walk(start_fd: int, target: str, last_may_link: bool) -> int:
        fd = os.open("/", flags) if target.startswith("/") else os.dup(start_fd)
        parts = [p for p in target.split("/") if p and p != "."]
        try:
            for i, part in enumerate(parts):
                final = i == len(parts) - 1
                try:
                    nfd = os.open(part, flags, dir_fd=fd)
                except OSError as exc:
                    if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                        raise
                    st = os.lstat(part, dir_fd=fd)
                    if not stat.S_ISLNK(st.st_mode):
                        raise
                    if final and not last_may_link:  # O_DIRECTORY says ENOTDIR for a link: say what it is
                        raise OSError(errno.ELOOP, "is a symbolic link") from None
                    if st.st_uid not in (uid, 0):
                        raise _Untrusted(
                            f"a link of uid {st.st_uid} ({part} -> {os.readlink(part, dir_fd=fd)})"
                        ) from None
                    budget[0] -= 1
                    if budget[0] < 0:
                        raise OSError(errno.ELOOP, "too many levels of symbolic links") from None
                    nfd = walk(fd, os.readlink(part, dir_fd=fd), True)
                os.close(fd)
                fd = nfd
            return fd
        except BaseException:
            os.close(fd)
            raise

    cwd = os.open(".", flags)
    try:
        return walk(cwd, path, False)
    finally:
        os.close(cwd)


def open_log(path: str, dir_fd: Optional[int] = None) -> TextIO:
    """Open ``path`` (relative to the log directory's descriptor ``dir_fd`` when given) for writing from the
    start; OSError if it is a link or not our own plain file."""
    return cast(TextIO, safewrite.open_own(path, dir_fd=dir_fd))
