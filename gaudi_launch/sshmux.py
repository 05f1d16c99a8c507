"""One SSH connection per host for the whole job: OpenSSH ControlMaster connections the job owns.

A handshake (key exchange, authentication, a fresh sshd) is most of what an ssh costs, and a job used
to make several per host: the pre-flight, mpirun's daemons, the end-of-job sweep. Now the pre-flight's
ssh to each host becomes that host's master (ControlMaster=yes, ControlPersist), and everything
after it (mpirun's daemons through plm_rsh_args, DeepSpeed's job file and pdsh, the sweep) runs as a
session over it (ControlMaster=no: with no master there, ssh simply connects on its own, as before).

The sockets live in a private directory of the job (0700, short enough for the 108-byte unix socket
limit), never in a path another job or user shares. The job closes every master (`ssh -O exit`) and
removes the directory when it ends, on failure and on Ctrl-C as well (atexit, for paths that end
before a backend runs: --check-only, a failed pre-flight); a launcher killed outright leaves a master
that exits by itself after PERSIST_S idle seconds.
"""
from __future__ import annotations

import atexit
import json
import os
import re
import select
import shutil
import stat
import subprocess
import tempfile
import threading
import time
from typing import Dict, List, Optional, Sequence
from gaudi_launch.teardown import AGENT_DONE

PERSIST_S = 60          # a master outliving a killed launcher exits after this long without a session
SOCKET = "%C"           # ssh's hash of local host, remote host, port and user: 40 characters
# sun_path holds 108 bytes with its NUL; ssh binds "PATH.XXXXXXXXXXXXXXXX" first, then renames it.
_MAX_DIR = 107 - 17 - 1 - 40

_lock = threading.Lock()
_by_job: Dict[str, "Connections"] = {}
_atexit = False


def control_dir(job_id: str, tmp: Optional[str] = None) -> str:
    """Where the job's sockets go: $TMPDIR/gaudi-launch-<job>-ssh, or /tmp when that is too long."""
    for base in (tmp or tempfile.gettempdir(), "/tmp"):
        path = os.path.join(base, f"gaudi-launch-{job_id}-ssh")
        if len(path.encode()) <= _MAX_DIR:
            return path
    raise ValueError(f"no directory short enough for ssh's control sockets (job {job_id})")


class Connections:
    """The job's masters: opened by the pre-flight's ssh to each host, used by every later ssh of the
    job through ``client_args()``, closed by ``close()``."""

    def __init__(self, job_id: str, ssh_args: Sequence[str], tmp: Optional[str] = None):
        self.job_id = job_id
        self.ssh_args = list(ssh_args)
        self.dir = control_dir(job_id, tmp)
        clean_stale(os.path.dirname(self.dir))
        os.mkdir(self.dir, 0o700)   # fresh: an existing path (someone else's) is an error
        self.hosts: List[str] = []  # hosts an ssh was asked to become the master of
        # Per host, the pre-flight's ssh itself, still running: its session's shell became a small
        # interpreter (teardown.AGENT_CODE) that sweeps the job at its end without a new session.
        self.agents: Dict[str, subprocess.Popen] = {}
        self._agent_locks: Dict[str, threading.Lock] = {}
        self.closed = False
        _register(self)

    @property
    def control_path(self) -> str:
        return os.path.join(self.dir, SOCKET)

    def client_args(self) -> List[str]:
        """For every ssh after the pre-flight: use the host's master when it is there."""
        return ["-o", f"ControlPath={self.control_path}", "-o", "ControlMaster=no"]

    def master_argv(self, host: str, command: str) -> List[str]:
        """ssh's argv that runs ``command`` on ``host`` and leaves its connection open as the master."""
        with _lock:
            if host not in self.hosts:
                self.hosts.append(host)
        return ["ssh", *self.ssh_args, "-o", f"ControlPath={self.control_path}", "-o", "ControlMaster=yes",
                "-o", f"ControlPersist={PERSIST_S}", host, command]

    def adopt(self, host: str, proc: subprocess.Popen) -> None:
        """Keep the pre-flight's ssh to ``host`` (its remote side now runs the sweep agent)."""
        with _lock:
            if self.closed:
                proc.kill()
                proc.wait()
                return
            self.agents[host] = proc
            self._agent_locks[host] = threading.Lock()

    def agent_run(self, host: str, args: List[str], timeout: float) -> Optional[str]:
        """One sweep through ``host``'s agent: KILL_CODE's output, or None (no agent, or it did not
        answer in time: the caller then uses a new ssh session)."""
        proc, lock = self.agents.get(host), self._agent_locks.get(host)
        if proc is None or lock is None or proc.poll() is not None:
            return None
        with lock:
            try:
                proc.stdin.write((json.dumps(args) + "\n").encode())
                proc.stdin.flush()
            except (OSError, ValueError):
                return None
            marker = (AGENT_DONE + "\n").encode()
            data = read_until(proc.stdout.fileno(), marker, time.monotonic() + timeout)
            if marker not in data:
                proc.kill()  # out of step now: never use it again
                proc.wait()
                return None
            return data[:data.index(marker)].decode("utf-8", "replace")

    def exit_argv(self, host: str) -> List[str]:
        return ["ssh", *self.ssh_args, "-o", f"ControlPath={self.control_path}", "-O", "exit", host]

    def live(self) -> List[str]:
        """The sockets in the directory now (one per open master)."""
        try:
            return sorted(os.listdir(self.dir))
        except OSError:
            return []

    def close(self) -> None:
        """Close every master and remove the directory. Idempotent."""
        with _lock:
            if self.closed:
                return
            self.closed = True
            _by_job.pop(self.job_id, None)
        agents = list(self.agents.values())
        for proc in agents:  # end of input: each agent exits, and its session with it
            try:
                proc.stdin.close()
            except OSError:
                pass
        _reap(agents, 3, 0.05)
        for proc in agents:
            for pipe in (proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()
        hosts = list(self.hosts) if self.live() else []
        # All at once, as processes (no threads: this also runs at interpreter exit, where a
        # thread pool refuses work). `ssh -O exit` only talks to the local master: quick.
        stopping = []
        try:
            for host in hosts:
                try:
                    stopping.append(subprocess.Popen(self.exit_argv(host), stdin=subprocess.DEVNULL,
                                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
                except OSError:
                    pass  # its ControlPersist ends it
            _reap(stopping, 10, 0.1)
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


def _reap(procs, seconds: float, least: float) -> None:
    """Wait for ``procs`` together for ``seconds`` (each at least ``least``), killing the late ones."""
    deadline = time.monotonic() + seconds
    for proc in procs:
        try:
            proc.wait(max(least, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def read_until(fd: int, marker: bytes, deadline: float) -> bytes:
    """What ``fd`` gives until ``marker`` (included), end of file or ``deadline`` (monotonic)."""
    data = b""
    while marker not in data:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            break
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        data += chunk
    return data


_DIR_NAME = re.compile(r"gaudi-launch-[0-9a-f]{8,64}-ssh")


def clean_stale(base: str, now: Optional[float] = None) -> List[str]:
    """Remove what a launcher killed outright (SIGKILL: no close) left in ``base``: directories of ours
    with the job's name that are empty (their masters have ended, taking their sockets along) and
    older than twice PERSIST_S. A live job's directory holds its sockets; rmdir never removes more."""
    removed = []
    now = time.time() if now is None else now
    try:
        names = os.listdir(base)
    except OSError:
        return removed
    for name in names:
        if not _DIR_NAME.fullmatch(name):
            continue
        path = os.path.join(base, name)
        try:
            st = os.lstat(path)
            if st.st_uid != os.geteuid() or not stat.S_ISDIR(st.st_mode) or now - st.st_mtime < 2 * PERSIST_S:
                continue
            os.rmdir(path)  # fails on a directory that is not empty
            removed.append(path)
        except OSError:
            continue
    return removed


def _register(conn: Connections) -> None:
    global _atexit
    with _lock:
        old = _by_job.get(conn.job_id)
        _by_job[conn.job_id] = conn
        if not _atexit:
            atexit.register(close_all)
            _atexit = True
    if old is not None and old is not conn:
        old.close()


def open_for(job_id: str, ssh_args: Sequence[str]) -> Connections:
    """The job's connections (a pre-flight run again for the same job replaces the earlier ones)."""
    return Connections(job_id, ssh_args)


def for_job(job_id: str) -> Optional[Connections]:
    with _lock:
        conn = _by_job.get(job_id)
    return conn if conn is not None and not conn.closed else None


def close_job(job_id: str) -> None:
    conn = for_job(job_id)
    if conn is not None:
        conn.close()


def close_all() -> None:
    with _lock:
        conns = list(_by_job.values())
    for conn in conns:
        conn.close()
