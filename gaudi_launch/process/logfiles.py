"""Per-rank log files (--log-dir) that another user cannot turn against us.

The launcher often runs as root and writes fixed names (rank-N.log): in a directory that someone
else can write to, a planted ``rank-0.log -> /etc/...`` would be overwritten. So the directory must
be ours (or root's) and writable by nobody else, unless it is sticky and ours (others can then add
files but not replace ours); each log is opened without following a symlink, and a file that is not
a plain file of ours with one link is refused before anything is truncated.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Collection
from typing import Optional, TextIO

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
    try:
        try:
            os.makedirs(path, mode=0o700)
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                os.fchmod(fd, 0o700)  # the umask may have taken bits off: still ours alone
            finally:
                os.close(fd)
        except FileExistsError:
            pass
        st = os.stat(path)
    except OSError as exc:
        raise UserError(f"cannot create the log directory: {exc.strerror or exc}", where=f"--log-dir {path}")
    problem = dir_problem(st, os.geteuid(), {os.getegid(), *os.getgroups()})
    if problem:
        raise UserError(
            f"the log directory {problem}: a planted rank-N.log link could make gaudi-launch overwrite another file",
            where=f"--log-dir {path}",
            hint="use a directory of your own that only you can write to (mkdir -m 700 DIR)",
        )


def open_log(path: str) -> TextIO:
    """Open ``path`` for writing from the start; OSError if it is a link or not our own plain file."""
    return safewrite.open_own(path)
