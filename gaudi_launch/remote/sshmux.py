"""One SSH connection per host for the whole job: OpenSSH ControlMaster connections the job owns.

A handshake (key exchange, authentication, a fresh sshd) is most of what an ssh costs, and a job used
to make several per host: the pre-flight, mpirun's daemons, the end-of-job sweep. Now the pre-flight's
ssh to each host becomes that host's master (ControlMaster=yes), and everything
after it (mpirun's daemons through plm_rsh_args, DeepSpeed's job file and pdsh, the sweep) runs as a
session over it (ControlMaster=no: with no master there, ssh simply connects on its own, as before).

The pre-flight's session itself stays too: after its probe, its shell becomes a small interpreter
(SESSION_AGENT) that answers the job's requests over the session's stdin and stdout: the end-of-job
sweep, and (OpenMPI 4) the start of mpirun's daemon on that host. mpirun's rsh agent is then
gaudi_launch/remote/rshagent.py, which hands each daemon's command line to this launcher over a unix socket in
the job's directory (``serve_rsh``); the launcher passes it to that host's session, which runs it with
the user's shell (`$SHELL -c`, from the home directory, as sshd would) and answers with its exit status
and output. So a host costs the job one handshake and one login shell, as under raw mpirun; a host
without a session (or no launcher to ask) gets a plain ssh over its master instead.

The sockets live in a private directory of the job (0700, short enough for the 108-byte unix socket
limit), never in a path another job or user shares. Each master is the pre-flight's ssh process itself
(no ControlPersist: no background process, nothing to stop one by one): the job ends its session (end
of the agent's input) and the master exits once the sessions over it have ended, taking its socket
along; the directory is removed when the job ends, on failure and on Ctrl-C as well (atexit, for paths
that end before a backend runs: --check-only, a failed pre-flight). A launcher killed outright closes
the agents' input all the same (its end of their pipes), so their masters end with their sessions.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import select
import shutil
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Collection, Sequence
from typing import Optional

from gaudi_launch.inputs.hostnames import bare_host
from gaudi_launch.remote import jobdir
from gaudi_launch.remote.fanout import per_host
from gaudi_launch.remote.teardown import AGENT_DONE, KILL_CODE

PERSIST_S = 60  # clean_stale leaves a job's directory younger than twice this alone
SOCKET = "%C"  # ssh's hash of local host, remote host, port and user: 40 characters
# sun_path holds 108 bytes with its NUL; ssh binds "PATH.XXXXXXXXXXXXXXXX" first, then renames it.
_MAX_DIR = 107 - 17 - 1 - 40

BUSY_WAIT_S = 2.0  # how long a bounded request waits for a session busy with another one
RSH_SOCKET = "rsh"  # in the job's directory: where rshagent.py asks for a daemon's start
RSH_AGENT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rshagent.py")
# What stops a value from travelling in mpirun's plm_rsh_agent, which mpirun splits on spaces.
_UNSPLITTABLE = re.compile(r"[\s'\"\\]")

# The pre-flight's session after its probe (run as `python -S -u -c SESSION_AGENT`): one request per
# stdin line, JSON. A list is a sweep: teardown.KILL_CODE's arguments, answered with its output. An
# object {"run": COMMAND} runs COMMAND as sshd runs a session's command (the user's shell with -c, from
# the home directory, stdin /dev/null), in this session's environment (what the login shell set up
# for the probe), as a shell nested in that one (SHLVL one up: bash reads ~/.bashrc again only for
# the outermost shell of an ssh session, and the environment it set up is already here), and answers one JSON line {"rc", "out", "err"} (bytes as latin-1; rc 255 when the
# shell died of a signal, as ssh reports it). Its output goes to files, not pipes: mpirun's daemon
# (orted --daemonize) leaves a child behind that must not keep the answer waiting. Every answer ends
# with the line AGENT_DONE. The agent exits at end of input (the launcher closed it, or died), even
# while a command runs (a daemon's start that hangs), killing that command's process group: the
# command runs in a session of its own, as sshd runs it, so a daemon that daemonized is not in it.
# While the command runs, the agent is the child subreaper of what it starts (Linux's
# PR_SET_CHILD_SUBREAPER): the daemon `orted --daemonize` forks off (its parent exits at once, before
# the daemon has even begun: OpenMPI 4.1's opal_daemon_init) becomes the agent's child, and the answer
# lists those children ("adopted": [[pid, name]]). Then {"reaped": 1} answers, as one JSON line, the
# children that have ended since ([[pid, exit code, or -signal]]): how the launcher learns that a
# daemon died after it detached, which mpirun itself never notices (sshmux.Connections.daemons_gone).
SESSION_AGENT = (
    "import contextlib, io, json, os, sys\n"
    f"code = compile({KILL_CODE!r}, 'sweep', 'exec')\n"
    "def subreaper(on):\n"
    "    try:\n"
    "        import ctypes\n"
    "        ctypes.CDLL(None, use_errno=True).prctl(36, 1 if on else 0, 0, 0, 0)\n"
    "    except Exception:\n"
    "        pass\n"
    "def children():\n"
    "    me, pids = os.getpid(), []\n"
    "    try:\n"
    "        with open('/proc/self/task/%d/children' % me) as f:\n"
    "            pids = [int(p) for p in f.read().split()]\n"
    "    except OSError:\n"
    "        for name in os.listdir('/proc'):\n"
    "            with contextlib.suppress(OSError, ValueError, IndexError):\n"
    "                with open('/proc/%s/stat' % name) as f:\n"
    "                    if name.isdigit() and int(f.read().rsplit(')', 1)[1].split()[1]) == me:\n"
    "                        pids.append(int(name))\n"
    "    out = []\n"
    "    for pid in pids:\n"
    "        try:\n"
    "            with open('/proc/%d/comm' % pid) as f:\n"
    "                out.append([pid, f.read().strip()])\n"
    "        except OSError:\n"
    "            out.append([pid, '?'])\n"
    "    return out\n"
    "def reaped():\n"
    "    out = []\n"
    "    while True:\n"
    "        try:\n"
    "            pid, status = os.waitpid(-1, os.WNOHANG)\n"
    "        except ChildProcessError:\n"
    "            break\n"
    "        if not pid:\n"
    "            break\n"
    "        out.append([pid, -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)])\n"
    "    return json.dumps(out) + '\\n'\n"
    "def run(command):\n"
    "    import select, signal, subprocess, tempfile\n"
    "    home = os.environ.get('HOME') or '/'\n"
    "    env = dict(os.environ)\n"
    "    try:\n"
    "        env['SHLVL'] = str(int(env.get('SHLVL') or 0) + 1)\n"
    "    except ValueError:\n"
    "        env['SHLVL'] = '1'\n"
    "    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:\n"
    "        subreaper(True)\n"
    "        try:\n"
    "            proc = subprocess.Popen([os.environ.get('SHELL') or '/bin/sh', '-c', command], stdin=subprocess.DEVNULL,\n"
    "                                    stdout=out, stderr=err, cwd=home if os.path.isdir(home) else '/', env=env,\n"
    "                                    start_new_session=True)\n"
    "            while True:\n"
    "                try:\n"
    "                    rc = proc.wait(0.5)\n"
    "                    break\n"
    "                except subprocess.TimeoutExpired:\n"
    "                    pass\n"
    "                if select.select([0], [], [], 0)[0] and not os.read(0, 1):\n"
    "                    with contextlib.suppress(OSError):\n"
    "                        os.killpg(proc.pid, signal.SIGKILL)\n"
    "                    os._exit(0)\n"
    "        except OSError as e:\n"
    "            err.write(('%s\\n' % e).encode())\n"
    "            rc = 127\n"
    "        finally:\n"
    "            subreaper(False)\n"
    "        out.seek(0)\n"
    "        err.seek(0)\n"
    "        return json.dumps({'rc': rc if rc >= 0 else 255, 'out': out.read().decode('latin-1'),\n"
    "                           'err': err.read().decode('latin-1'), 'adopted': children()}) + '\\n'\n"
    "for line in sys.stdin:\n"
    "    request = None\n"
    "    try:\n"
    "        request = json.loads(line)\n"
    "        if isinstance(request, dict) and 'reaped' in request:\n"
    "            text = reaped()\n"
    "        elif isinstance(request, dict):\n"
    "            text = run(request['run'])\n"
    "        else:\n"
    "            buf = io.StringIO()\n"
    "            sys.argv = ['sweep'] + [str(a) for a in request]\n"
    "            with contextlib.redirect_stdout(buf):\n"
    "                exec(code, {'__name__': '__main__'})\n"
    "            text = buf.getvalue()\n"
    "    except BaseException as e:\n"
    "        text = (json.dumps({'rc': 255, 'out': '', 'err': 'gaudi-launch session agent: %r\\n' % (e,)}) + '\\n'\n"
    "                if isinstance(request, dict) else '-1\\n')\n"
    f"    sys.stdout.write(text + {AGENT_DONE!r} + '\\n')\n"
    "    sys.stdout.flush()\n"
)

_lock = threading.Lock()
_by_job: dict[str, Connections] = {}
_atexit = False


def control_dir(job_id: str, tmp: Optional[str] = None) -> str:
    """Where the job's sockets go: $TMPDIR/gaudi-launch-<job>-ssh, or /tmp when that is too long."""
    for base in (tmp or tempfile.gettempdir(), "/tmp"):
        path = os.path.join(base, f"gaudi-launch-{job_id}-ssh")
        if len(path.encode()) <= _MAX_DIR:
            return path
    raise ValueError(f"no directory short enough for ssh's control sockets (job {job_id})")


def peer_uid(conn: socket.socket) -> Optional[int]:
    """The user id of the process at the other end of a unix socket, as the kernel saw it connect."""
    try:
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except (OSError, AttributeError):  # AttributeError: a platform without SO_PEERCRED
        return None
    return struct.unpack("3i", creds)[1]


class Connections:
    """The job's masters: opened by the pre-flight's ssh to each host, used by every later ssh of the
    job through ``client_args()``, closed by ``close()``."""

    def __init__(self, job_id: str, ssh_args: Sequence[str], tmp: Optional[str] = None):
        self.job_id = job_id
        self.ssh_args = list(ssh_args)
        self.dir = control_dir(job_id, tmp)
        # the job directory first: the control directory's name shows the id to every user of /tmp
        self.job_dir = jobdir.path_for(job_id)
        self._reserved = jobdir.reserve(self.job_dir)
        clean_stale(os.path.dirname(self.dir))
        os.mkdir(self.dir, 0o700)  # fresh: an existing path (someone else's) is an error
        self.hosts: list[str] = []  # hosts an ssh was asked to become the master of
        # Per host, the pre-flight's ssh itself, still running: its session's shell became a small
        # interpreter (teardown.AGENT_CODE) that sweeps the job at its end without a new session.
        self.agents: dict[str, subprocess.Popen] = {}
        self._agent_locks: dict[str, threading.Lock] = {}
        self._rsh: Optional[socket.socket] = None  # serve_rsh's listening socket
        self.daemons_started: dict[str, int] = {}  # per host, commands run through its session (run_command)
        self.daemons_pending: dict[str, int] = {}  # per host, those whose answer has not come yet
        # per host, what its session adopted when a command run through it left a daemon (SESSION_AGENT):
        # pid -> name, and those of them that ended since: pid -> (name, exit code or -signal)
        self.adopted: dict[str, dict[int, str]] = {}
        self.ended: dict[str, dict[int, tuple[str, int]]] = {}
        self.closed = False
        _register(self)

    @property
    def control_path(self) -> str:
        return os.path.join(self.dir, SOCKET)

    def client_args(self) -> list[str]:
        """For every ssh after the pre-flight: use the host's master when it is there."""
        return ["-o", f"ControlPath={self.control_path}", "-o", "ControlMaster=no"]

    def master_argv(self, host: str, command: str) -> list[str]:
        """ssh's argv that runs ``command`` on ``host`` and serves as the master while it runs (and
        while sessions over it last)."""
        with _lock:
            if host not in self.hosts:
                self.hosts.append(host)
        return [
            "ssh",
            *self.ssh_args,
            "-o",
            f"ControlPath={self.control_path}",
            "-o",
            "ControlMaster=yes",
            host,
            command,
        ]

    def adopt(self, host: str, proc: subprocess.Popen) -> None:
        """Keep the pre-flight's ssh to ``host`` (its remote side now runs the sweep agent)."""
        with _lock:
            if self.closed:
                proc.kill()
                proc.wait()
                return
            self.agents[host] = proc
            self._agent_locks[host] = threading.Lock()

    def agent_run(self, host: str, args: list[str], timeout: float) -> Optional[str]:
        """One sweep through ``host``'s agent: KILL_CODE's output, or None (no agent, or it did not
        answer in time: the caller then uses a new ssh session)."""
        answer, _ = self._ask(host, args, timeout)
        return answer

    def run_command(self, host: str, command: str, timeout: Optional[float] = None) -> Optional[dict]:
        """Run ``command`` on ``host`` through its session (SESSION_AGENT's {"run": ...}): {"rc", "out",
        "err"}; None when there is no session to ask (the caller may use ssh instead). A session that
        took the command and gave no answer (it died, or ``timeout``) answers rc 255, as ssh would: the
        command may have run, so it is never run a second time."""
        with _lock:
            self.daemons_pending[host] = self.daemons_pending.get(host, 0) + 1
        try:
            answer, sent = self._ask(host, {"run": command}, timeout)
        finally:
            with _lock:
                self.daemons_pending[host] -= 1
                if not self.daemons_pending[host]:
                    del self.daemons_pending[host]
        if answer is None:
            if not sent:
                return None
            return {"rc": 255, "out": "", "err": f"gaudi-launch: no answer from the job's session to {host}\n"}
        with _lock:
            self.daemons_started[host] = self.daemons_started.get(host, 0) + 1
        try:
            res = json.loads(answer)
            adopted = {int(pid): str(name) for pid, name in res.get("adopted") or ()}
            if adopted:
                with _lock:
                    self.adopted.setdefault(host, {}).update(adopted)
            return {"rc": int(res["rc"]), "out": str(res.get("out", "")), "err": str(res.get("err", ""))}
        except (ValueError, KeyError, TypeError):
            return {"rc": 255, "out": "", "err": f"gaudi-launch: unreadable answer from the job's session to {host}\n"}

    def starting(self) -> list[str]:
        """The hosts with a command run through their session (mpirun's daemon start) not answered yet."""
        with _lock:
            return sorted(self.daemons_pending)

    def daemons_gone(self, skip: Collection[str] = (), timeout: float = 10.0) -> dict[str, dict[int, tuple[str, int]]]:
        """The daemons that commands run through the sessions left behind (mpirun's orted, adopted by
        the session: SESSION_AGENT) and that have ended since, per host: {pid: (name, exit code or
        -signal)}. Asks every host with an adopted daemon still running, but those in ``skip``, all at
        once; a session that is busy or does not answer tells nothing this time."""
        with _lock:
            hosts = [h for h, pids in self.adopted.items() if h not in skip and set(pids) - set(self.ended.get(h, ()))]

        def ask(host: str) -> None:
            answer, _ = self._ask(host, {"reaped": 1}, timeout)
            try:
                exits = [(int(pid), int(code)) for pid, code in json.loads(answer or "[]")]
            except (ValueError, TypeError):
                return
            with _lock:
                mine = self.adopted.get(host, {})
                for pid, code in exits:
                    if pid in mine:
                        self.ended.setdefault(host, {})[pid] = (mine[pid], code)

        if hosts:
            per_host(hosts, ask, timeout=timeout + BUSY_WAIT_S + 2, default=lambda _: None, name="sshmux-reaped")
        with _lock:
            return {h: dict(found) for h, found in self.ended.items() if found}

    def _ask(self, host: str, request, timeout: Optional[float]):
        """(the answer before AGENT_DONE or None, whether the request was written)."""
        proc, lock = self.agents.get(host), self._agent_locks.get(host)
        if proc is None or lock is None or proc.poll() is not None:
            return None, False
        assert proc.stdin is not None and proc.stdout is not None  # adopted with pipes
        # A bounded request (the sweep) never queues behind a session that is busy: a daemon's start
        # that never returns (an orted that hangs) holds it for good, and teardown must not wait on it.
        if not lock.acquire(timeout=-1 if timeout is None else min(timeout, BUSY_WAIT_S)):
            return None, False
        try:
            try:
                proc.stdin.write((json.dumps(request) + "\n").encode())
                proc.stdin.flush()
            except (OSError, ValueError):
                return None, False
            marker = (AGENT_DONE + "\n").encode()
            data = read_until(proc.stdout.fileno(), marker, None if timeout is None else time.monotonic() + timeout)
            if marker not in data:
                proc.kill()  # out of step now: never use it again
                proc.wait()
                return None, True
            return data[: data.index(marker)].decode("utf-8", "replace"), True
        finally:
            lock.release()

    def agent_for(self, name: str) -> Optional[str]:
        """The host (as the pre-flight named it) whose session serves ``name``, a host as mpirun gives it
        to its rsh agent (user@host when the hostfile names the user, mpirun's hostfile carrying it; else
        the bare name); None when there is none or it is ambiguous."""
        if name in self.agents:
            return name
        found = [h for h in self.agents if bare_host(h) == name]
        return found[0] if len(found) == 1 else None

    # ---- mpirun's daemons through the sessions (rshagent.py asks here)

    def rsh_socket(self) -> str:
        return os.path.join(self.dir, RSH_SOCKET)

    def rsh_agent(self, ssh_words: int) -> Optional[str]:
        """mpirun's plm_rsh_agent value that starts daemons through the sessions (serve_rsh), for
        ``ssh_words`` words of plm_rsh_args; None when a path in it would not survive mpirun's split
        on spaces (then mpirun's own ssh over the masters it is)."""
        words = [sys.executable, "-S", "-I", RSH_AGENT, self.rsh_socket(), str(int(ssh_words))]
        if any(not w or _UNSPLITTABLE.search(w) for w in words):
            return None
        return " ".join(words)

    def serve_rsh(self) -> str:
        """Listen on the job's rsh socket (0700 directory: only this user) and answer rshagent.py's
        requests until close(): each one {"host", "command"} is run through that host's session
        (run_command), or answered {"fallback": true} when it has none. The socket's path."""
        with _lock:
            if self.closed:
                raise RuntimeError("the job's connections are closed")
            if self._rsh is not None:
                return self.rsh_socket()
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            # 0600 whatever the umask: Linux gives the bound file the mode of the socket's inode.
            os.fchmod(sock.fileno(), 0o600)
            sock.bind(self.rsh_socket())
            os.chmod(self.rsh_socket(), 0o600)  # elsewhere, after the fact (the directory is 0700 meanwhile)
            sock.listen(128)
            self._rsh = sock
        threading.Thread(target=self._accept, args=(sock,), name="sshmux-rsh", daemon=True).start()
        return self.rsh_socket()

    def _accept(self, sock: socket.socket) -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:  # closed: the job is over
                return
            threading.Thread(target=self._answer, args=(conn,), name="sshmux-rsh-host", daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        """One rshagent.py request, "HOST\0COMMAND\n"; the answer "fallback\n" (no session for the
        host) or "RC OUTLEN ERRLEN\n" and the output's bytes, then the error output's. Only this
        user's processes are answered (the kernel's SO_PEERCRED): a command sent here runs on a host."""
        with conn:
            uid = peer_uid(conn)
            if uid != os.geteuid():
                sys.stderr.write(
                    f"gaudi-launch: the job's rsh socket {self.rsh_socket()} refused a request from uid {uid} "
                    "(only this user's mpirun may ask)\n"
                )
                return  # closed unanswered: nothing run, nothing said
            try:
                with conn.makefile("rb") as f:
                    line = f.readline(1 << 20)
                host, sep, command = line.rstrip(b"\n").decode("utf-8", "surrogateescape").partition("\0")
                agent = self.agent_for(host) if sep and line.endswith(b"\n") else None
                answer = self.run_command(agent, command) if agent is not None else None
                if answer is None:
                    conn.sendall(b"fallback\n")
                    return
                out, err = answer["out"].encode("latin-1"), answer["err"].encode("latin-1")
                conn.sendall(f"{answer['rc']} {len(out)} {len(err)}\n".encode() + out + err)
            except (OSError, ValueError):
                return  # rshagent.py then fails its start (exit 255), as an ssh that lost its connection

    def exit_argv(self, host: str) -> list[str]:
        return ["ssh", *self.ssh_args, "-o", f"ControlPath={self.control_path}", "-O", "exit", host]

    def live(self) -> list[str]:
        """The masters' sockets in the directory now (one per open master)."""
        try:
            return sorted(n for n in os.listdir(self.dir) if n != RSH_SOCKET)
        except OSError:
            return []

    def close(self) -> None:
        """Close every master and remove the directory. Idempotent."""
        with _lock:
            if self.closed:
                return
            self.closed = True
            _by_job.pop(self.job_id, None)
            rsh, self._rsh = self._rsh, None
        if self._reserved:
            jobdir.release(self.job_dir)  # unless a backend took it (it removes it at the job's end)
        if rsh is not None:
            try:
                rsh.shutdown(socket.SHUT_RDWR)  # wakes the accept() of serve_rsh's thread
            except OSError:
                pass
            rsh.close()
        agents = list(self.agents.values())
        for proc in agents:  # end of input: each agent exits, its session with it, then its master
            try:
                if proc.stdin is not None:
                    proc.stdin.close()
            except OSError:
                pass
        _reap(agents, 3, 0.05)  # a master still serving sessions after that is killed with them
        for proc in agents:
            for pipe in (proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()
        hosts = list(self.hosts) if self.live() else []
        # Masters not adopted (a pre-flight's ssh still starting, say): all at once, as processes (no
        # threads: this also runs at interpreter exit, where a thread pool refuses work). `ssh -O
        # exit` only talks to the local master: quick.
        stopping = []
        try:
            for host in hosts:
                try:
                    stopping.append(
                        subprocess.Popen(
                            self.exit_argv(host),
                            stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL,
                        )
                    )
                except OSError:
                    pass  # the end of its own session ends it
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


def read_until(fd: int, marker: bytes, deadline: Optional[float]) -> bytes:
    """What ``fd`` gives until ``marker`` (included), end of file or ``deadline`` (monotonic; None:
    no limit)."""
    data = b""
    while marker not in data:
        left = None if deadline is None else deadline - time.monotonic()
        if (left is not None and left <= 0) or not select.select([fd], [], [], left)[0]:
            break
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        data += chunk
    return data


_DIR_NAME = re.compile(r"gaudi-launch-[0-9a-f]{8,64}-ssh")


def clean_stale(base: str, now: Optional[float] = None) -> list[str]:
    """Remove what a launcher killed outright (SIGKILL: no close) left in ``base``: directories of ours
    with the job's name, older than twice PERSIST_S, that are empty (their masters have ended, taking
    their sockets along) but for an rsh socket nobody listens on any more. A live job's directory holds
    its sockets; rmdir never removes more."""
    removed: list[str] = []
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
            if os.listdir(path) == [RSH_SOCKET] and _abandoned(os.path.join(path, RSH_SOCKET)):
                os.unlink(os.path.join(path, RSH_SOCKET))
            os.rmdir(path)  # fails on a directory that is not empty
            removed.append(path)
        except OSError:
            continue
    return removed


def _abandoned(path: str) -> bool:
    """Whether ``path`` is a unix socket of ours that no process listens on (its launcher is gone)."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    if not stat.S_ISSOCK(st.st_mode) or st.st_uid != os.geteuid():
        return False
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
        return False  # a launcher answers there: its job runs
    except ConnectionRefusedError:
        return True
    except OSError:
        return False
    finally:
        probe.close()


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


class _Lent:
    """A job's connections lent to a job it runs before its own ranks (the collective check): that job
    uses them as its own (its daemons and its sweep through the sessions), and its end gives them back
    instead of closing them."""

    def __init__(self, conn: Connections, job_id: str):
        self._conn, self._job_id = conn, job_id

    def __getattr__(self, name):
        return getattr(self._conn, name)

    def close(self) -> None:
        with _lock:
            if _by_job.get(self._job_id) is self:
                del _by_job[self._job_id]


@contextlib.contextmanager
def lent(job_id: str, to_job_id: str):
    """While inside: the job ``to_job_id`` runs over ``job_id``'s connections, when it has any."""
    conn = for_job(job_id)
    loan = None if conn is None else _Lent(conn, to_job_id)
    if loan is not None:
        with _lock:
            _by_job[to_job_id] = loan  # type: ignore[assignment]  # used as the job's Connections
    try:
        yield
    finally:
        if loan is not None:
            loan.close()
