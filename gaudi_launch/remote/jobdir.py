"""The per-job directory and the job file: how a job's environment reaches ranks without argv.

``ps`` shows every process's argv to every user of a host, so values (tokens, passwords) travel in
a file instead: ``$TMPDIR/gaudi-launch-<job id>/job.json``, created 0600 with O_EXCL in a directory
created fresh 0700. Remote hosts get the same path, written by ``python -m gaudi_launch.remote.jobdir
receive`` over ssh's stdin; argv carries only the path and a SHA-256 digest (of a payload with a
random key, so the digest reveals nothing about short values). A directory left behind by a killed
job is removed at the next start on that host, once nothing carries its job id any more.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping
from typing import Optional

# The naming and the private-file rules are the wire module's (the rank side shares them); path_for and
# JobDirError stay reachable here for the backends.
from gaudi_launch.wire import JOB_ID, PREFIX, JobDirError, check_private_dir, path_for, write_private  # noqa: F401

JOB_FILE = "job.json"
OWNER_FILE = "owner"
RESERVED = "reserved"  # made by reserve(), taken by the backend's create()
STALE_AFTER_S = 120.0  # a directory this young may belong to a job whose ranks are still starting
# What a path on DeepSpeed's pdsh line may contain: it is pasted into a remote shell unquoted.
SAFE_PATH = re.compile(r"[A-Za-z0-9_./-]+")
# What follows PREFIX in a job's directories: its id, then a rank's job directory's random suffix
# (wire.JOB_DIR_SUFFIX) or a rank's private directory (the worker's TORCHELASTIC_ERROR_FILE, from mkdtemp),
# left behind when that rank was SIGKILLed.
_JOB_DIR_NAME = re.compile(r"([0-9a-f]{8,64})(-[0-9a-f]{16}|-rank[0-9]*-[A-Za-z0-9_]+)?")


def payload(env: Mapping[str, str], argv: list[str], module: bool, cwd: str, key: str) -> bytes:
    """What a rank needs and no launcher may mangle. Deterministic for one plan. Pure."""
    return json.dumps(
        {"env": dict(env), "argv": list(argv), "module": module, "cwd": cwd, "key": key}, sort_keys=True
    ).encode()


def digest(data: bytes) -> str:
    import hashlib  # here: every rank imports this module, and only a job file's ranks need a digest (OpenSSL)

    return hashlib.sha256(data).hexdigest()


def create(path: str) -> None:
    """The launcher's job directory: fresh (an existing one is never reused, unless this very launcher
    reserved it: ``reserve``), 0700, with an owner record. FileExistsError otherwise."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        if reserved_here(path):
            try:
                os.unlink(os.path.join(path, RESERVED))  # taken once: a second create fails as ever
                return
            except FileNotFoundError:
                pass
        raise
    os.chmod(path, 0o700)  # whatever the umask
    write_private(os.path.join(path, OWNER_FILE), owner_record().encode())


def reserve(path: str) -> bool:
    """Make the launcher's job directory before anything shows the job id to other users (the ssh control
    directory gaudi-launch-<id>-ssh in /tmp does): no one can make it first after seeing the id. False
    when it exists already (the backend then names its owner)."""
    try:
        create(path)
        write_private(os.path.join(path, RESERVED), b"")
        return True
    except FileExistsError:
        return False


def reserved_here(path: str) -> bool:
    """Whether ``path`` is a private directory of ours whose owner record is this process's."""
    try:
        check_private_dir(path)
        fd = os.open(os.path.join(path, OWNER_FILE), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as f:
            return f.read(4096).decode("utf-8", "replace") == owner_record()
    except (OSError, JobDirError):
        return False


def release(path: str) -> None:
    """Remove a reserved job directory no backend used (it holds the owner record only)."""
    try:
        if reserved_here(path) and sorted(os.listdir(path)) == sorted([OWNER_FILE, RESERVED]):
            os.unlink(os.path.join(path, RESERVED))
            os.unlink(os.path.join(path, OWNER_FILE))
            os.rmdir(path)
    except OSError:
        pass


def owner_of(path: str) -> str:
    """Who made ``path``, for a message about a job directory that exists already: 'you' or 'user NAME (uid N)'."""
    try:
        uid = os.lstat(path).st_uid
    except OSError:
        return "gone since"
    if uid == os.geteuid():
        return "made by you"
    try:
        return f"made by user {pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"made by uid {uid}"


def owner_record(pid: Optional[int] = None) -> str:
    pid = os.getpid() if pid is None else pid
    return f"{socket.gethostname()} {pid} {_start_time(pid) or 0}\n"


def read_job(path: str, want: str) -> dict:
    """The job file, only if it is ours, private, and has the digest the launcher put on argv."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise JobDirError(f"{path} is not a private file of this user")
        data = f.read()
    if digest(data) != want:
        raise JobDirError(f"{path} does not have the digest the launcher gave (another job's file?)")
    return json.loads(data)


def receive(directory: str, want: str, data: bytes) -> None:
    """On a remote host: put the job file in place. A directory that exists already is accepted only
    when it is ours and private (a filesystem shared with the launcher's host), and an existing job
    file only when it is the very same file."""
    if digest(data) != want:
        raise JobDirError("the job file arrived damaged (digest mismatch)")
    clean_stale(os.path.dirname(directory))
    try:
        os.mkdir(directory, 0o700)
        os.chmod(directory, 0o700)
        write_private(os.path.join(directory, OWNER_FILE), owner_record(0).encode())
    except FileExistsError:
        check_private_dir(directory)
    path = os.path.join(directory, JOB_FILE)
    try:
        write_private(path, data)
    except FileExistsError:
        read_job(path, want)


# ---------------------------------------------------------------- leftovers of killed jobs


def _start_time(pid: int) -> Optional[int]:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def live_job_ids() -> set[str]:
    """The job ids that processes of this user on this host still carry."""
    ids: set[str] = set()
    needle = JOB_ID.encode() + b"="
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read()
        except OSError:
            continue
        for item in env.split(b"\0"):
            if item.startswith(needle):
                ids.add(item[len(needle) :].decode(errors="replace"))
    return ids


def is_stale(owner: Optional[str], job_id: str, age_s: float, live_ids: set[str], hostname: str) -> bool:
    """Whether a job directory belongs to a job that is over. Pure.

    ``owner`` is its owner record ('host pid start'), None when it has none. A directory another
    host's launcher made (a filesystem shared across hosts) is not ours to judge.
    """
    if job_id in live_ids or age_s < STALE_AFTER_S:
        return False
    if owner is None:
        return True
    parts = owner.split()
    if len(parts) != 3 or parts[0] != hostname:
        return False
    pid, start = int(parts[1]), int(parts[2])
    return pid == 0 or _start_time(pid) != start


def _job_id(name: str) -> Optional[str]:
    """The job id in a job directory's name; None for any other name. Pure."""
    m = _JOB_DIR_NAME.fullmatch(name[len(PREFIX) :]) if name.startswith(PREFIX) else None
    return m.group(1) if m else None


def clean_stale(tmp: Optional[str] = None, now: Optional[float] = None) -> list[str]:
    """Remove this user's job directories whose jobs are over; the paths removed."""
    tmp = tmp or tempfile.gettempdir()
    now = time.time() if now is None else now
    try:
        names = [n for n in os.listdir(tmp) if _job_id(n) is not None]
    except OSError:
        return []
    if not names:
        return []
    # every process's environment is read only once a directory is old enough to be stale (is_stale needs no
    # live ids for a young one): a rank 0 cleans at each start, mostly beside young directories alone
    live: Optional[set[str]] = None
    host, removed = socket.gethostname(), []
    for name in names:
        path = os.path.join(tmp, name)
        try:
            check_private_dir(path)
            age = now - os.lstat(path).st_mtime
        except (OSError, JobDirError):
            continue  # not ours: leave it alone
        try:
            with open(os.path.join(path, OWNER_FILE)) as f:
                owner: Optional[str] = f.read()
        except OSError:
            owner = None
        job_id = _job_id(name)
        if live is None and age >= STALE_AFTER_S:
            live = live_job_ids()
        try:
            stale = job_id is not None and is_stale(owner, job_id, age, live or set(), host)
        except ValueError:
            stale = False
        if stale:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def remove(directories: Iterable[str]) -> None:
    for d in directories:
        shutil.rmtree(d, ignore_errors=True)


# How long the watch of a SIGKILLed launcher's job directory waits for the job's processes on this host to
# end (each rank's own watch ends them within --grace + 10 s: worker.watch_launcher; --grace < 3600).
WATCH_WAIT_S = 3600 + 60


def remove_when_gone(path: str, job_id: str) -> None:
    """A small process that removes the launcher's job directory ``path`` once this launcher is gone and no
    process here carries ``job_id`` any more: after a SIGKILL, a host that ran no rank had no one else to
    remove it (ranks' hosts have their watch). It reads a pipe this process holds open: end of file is
    the launcher's end, however it came. Not in the job (no job id in its environment: the sweeps spare
    it) and in a session of its own (Ctrl-C does not reach it)."""
    read_end, write_end = os.pipe()
    env = {k: v for k, v in os.environ.items() if k != JOB_ID}
    subprocess.Popen(
        [sys.executable, "-m", "gaudi_launch.remote.jobdir", "watch", path, job_id, owner_record()],
        stdin=read_end,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
        start_new_session=True,
        close_fds=True,
    )
    os.close(read_end)
    os.set_inheritable(write_end, False)
    _WATCH_PIPES[path] = write_end  # open while the job runs: closed by stop_watch, or by the kernel at our end


_WATCH_PIPES: dict[str, int] = {}


def stop_watch(path: str) -> None:
    """The job is over and its directory removed here: let its watch go (it finds nothing to remove)."""
    fd = _WATCH_PIPES.pop(path, None)
    if fd is not None:
        os.close(fd)


def watch(path: str, job_id: str, owner: str) -> None:
    """``remove_when_gone``'s process: wait for end of file on stdin, then for the job's processes here to
    end, then remove ``path`` if it is still ours, private and this launcher's (its owner record)."""
    while True:
        if select.select([0], [], [], 5.0)[0]:
            if not os.read(0, 4096):
                break  # the launcher is gone
        elif not os.path.lexists(path):
            return  # removed already (the job ended): nothing left to watch
    deadline = time.monotonic() + WATCH_WAIT_S
    while job_id in live_job_ids() and time.monotonic() < deadline:
        time.sleep(1.0)
    try:
        check_private_dir(path)
        fd = os.open(os.path.join(path, OWNER_FILE), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as f:
            if f.read(4096).decode("utf-8", "replace") != owner:
                return  # not the directory this launcher made
    except (OSError, JobDirError):
        return  # gone already (the launcher's own cleanup), or not ours
    shutil.rmtree(path, ignore_errors=True)


def main(argv: list[str]) -> int:
    """``receive DIR DIGEST`` (the job file on stdin) or ``remove DIR``: run on remote hosts over ssh;
    ``watch DIR JOB OWNER``: remove_when_gone's process."""
    try:
        if argv[:1] == ["watch"] and len(argv) == 4:
            watch(argv[1], argv[2], argv[3])
            return 0
        if argv[:1] == ["receive"] and len(argv) == 3:
            receive(argv[1], argv[2], sys.stdin.buffer.read())
            return 0
        if argv[:1] == ["remove"] and len(argv) == 2:
            if os.path.basename(argv[1]).startswith(PREFIX) and os.path.lexists(argv[1]):
                check_private_dir(argv[1])
                remove([argv[1]])
            return 0
    except (OSError, JobDirError) as exc:
        print(f"gaudi-launch: {exc}", file=sys.stderr)
        return 1
    print("usage: python -m gaudi_launch.remote.jobdir receive DIR DIGEST | remove DIR", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
