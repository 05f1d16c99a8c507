"""The rank's side of the one-pass tree start (``--fan-out tree``, one pass: remote/onepass.py).

The job's own mpirun starts every rank through OpenMPI's daemon tree, with three variables in their environment
(never on argv, through mpirun's ``-x``): where the launcher listens (GATE), a random per-job key (GATE_KEY) and
the probe's arguments (GATE_PROBE). Before anything of the user's runs, each rank connects to the launcher; the
first rank of each host (LOCAL_RANK 0) first runs the pre-flight's probe on its host (probe.command: the same
probe.sh and probe_checks.py the ssh pre-flight runs, so the same facts, judged by the same code) and sends its
output. Then it waits for the launcher's verdict: go (with the variables the hosts' facts add to the plan: the
interface, the scale-out settings, the cards) or stop (a host failed its checks: the rank exits 3, the user's
script never started anywhere). It leaves the verdict, as the launcher signed it, in the job's private directory
for the host's other ranks, which read it there and check its MAC: one connection per host, not per rank (the
launcher's one thread takes 8x fewer at 8 ranks a host; issue 34). A job without a directory (no job id) has
every rank ask the launcher itself.

Both directions are authenticated with the key (HMAC-SHA256): a rank's hello carries a fresh nonce and a MAC
over its whole message; the launcher's verdict a MAC over the rank's nonce and the verdict, so neither another
process on the network nor a replayed verdict can start or stop ranks, or give them variables. At its end the
last rank of a host sweeps what the job left there (teardown.sweep_here) and says so (on the first rank's
connection, or on one of its own made then), so the launcher's own sweep skips that host.

Standard library only, imported by the rank bootstrap only when GATE is set.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, MutableMapping
from typing import Optional

from gaudi_launch.remote.gatewire import MAX_LINE, STOP_EXIT, hello, read_verdict, swept_line
from gaudi_launch.remote.teardown import sweep_here
from gaudi_launch.wire import (
    GATE,
    GATE_KEY,
    GATE_PASSED,
    GATE_PROBE,
    JOB_ID,
    SWEEP_OWN_UTS,
    create_private,
    open_private_dir,
    rank_dir,
)

__all__ = ["GATE", "GATE_KEY", "GATE_PROBE", "STOP_EXIT", "Gate", "at_exit", "wait_for_go"]

PROBE_TIMEOUT = 60.0  # (remote/preflight.PROBE_TIMEOUT)
CHECKS_TIMEOUT = 20.0  # (probe.sh's _t: each tool's time limit)
PROBE_END = "@@gaudi-launch-probe end"  # (remote/probe.END)
VERDICT_POLL_S = 0.02  # how often a host's other ranks look for the verdict its first rank leaves
# Variables read by the dynamic loader or the interpreter at start-up: the rank re-executes itself for them.
_STARTUP_VARS = ("LD_LIBRARY_PATH", "LD_PRELOAD", "PYTHONPATH", "PYTHONHOME")


def probe_here(args: Mapping, environ: Mapping[str, str]) -> str:
    """The pre-flight's probe on this host, as the ssh pre-flight runs it: the command line the launcher built
    (remote/probe.command, the master host's with its port check), run by sh, and the probe's Python checks
    (``checks``) in a fork of this interpreter rather than a new one (its output; a line saying why when it could
    not run)."""
    master = str(args.get("master_node")) == environ.get("NODE_RANK", "")
    cmd = args.get("master_command" if master else "command")
    if not isinstance(cmd, str):
        return ""
    try:
        done = subprocess.run(
            ["sh", "-c", cmd], stdin=subprocess.DEVNULL, capture_output=True, timeout=PROBE_TIMEOUT, cwd="/"
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return f"@@gaudi-launch-probe-error {type(exc).__name__}: {exc}\n"
    out = done.stdout.decode("utf-8", "replace")
    code, argv = args.get("checks"), args.get("master_checks_argv" if master else "checks_argv")
    if isinstance(code, str) and isinstance(argv, list):
        head, end, tail = out.rpartition(PROBE_END + "\n")
        out = head + checks_here(code, [str(a) for a in argv]) + end + tail if end else out
    return out


def checks_here(code: str, argv: list[str]) -> str:
    """The probe's Python checks (remote/probe.checks_code) in a forked child of this interpreter: as
    ``python -c CODE ARGV...`` from "/" with its error output dropped and CHECKS_TIMEOUT s at most, as probe.sh runs
    them, less an interpreter's start. Its output; when it printed nothing, what probe.sh then says (the checks
    did not run)."""
    for stream in (sys.stdout, sys.stderr):  # nothing buffered here may be written twice, by the child too
        stream.flush()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        try:
            os.close(read_end)
            os.dup2(write_end, 1)
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 2)
            signal.signal(signal.SIGALRM, signal.SIG_DFL)
            signal.alarm(int(CHECKS_TIMEOUT))
            os.chdir("/")
            sys.stdout = os.fdopen(1, "w", closefd=False)
            sys.argv = ["-c", *argv]
            exec(compile(code, "<probe checks>", "exec"), {"__name__": "__main__"})
            sys.stdout.flush()
        finally:
            os._exit(0)
    os.close(write_end)
    chunks = []
    with os.fdopen(read_end, "rb") as f:
        while chunk := f.read(65536):
            chunks.append(chunk)
    os.waitpid(pid, 0)
    text = b"".join(chunks).decode("utf-8", "replace")
    if not text.strip():  # (probe.sh's _unknown)
        text = "python_ok=0\nmaster_reachable=unknown\n" + ("port_free=unknown\n" if len(argv) > 3 else "")
    return text if text.endswith("\n") else text + "\n"


class Gate:
    """This rank's way to the launcher for the end-of-job message: the host's first rank keeps its connection
    open for its life; another rank (``sock`` None) connects when it is the one to say the host was swept."""

    def __init__(
        self, sock: Optional[socket.socket], key: bytes, nonce: str, host: str, where="", rank="", lock_fd=None
    ):
        self.sock, self.key, self.nonce, self.host = sock, key, nonce, host
        self.where, self.rank = where, rank
        self.lock_fd: Optional[int] = lock_fd

    def at_exit(self, job: str) -> None:
        at_exit(self, job)

    def swept(self, hit: int) -> None:
        try:
            if self.sock is None:  # a hello of its own first (the launcher reads "swept" on a known nonce)
                self.sock, self.nonce = _connect(self.where, 5.0), _nonce()
                self.sock.sendall(hello(self.key, self.rank, self.host, None, self.nonce))
                _read_line(self.sock)
            self.sock.sendall(swept_line(self.key, self.nonce, self.host, hit))
        except OSError:
            pass  # the launcher's sweep then covers this host


def _connect(where: str, deadline_s: float = 30.0) -> socket.socket:
    host, _, port = where.rpartition(":")
    return socket.create_connection((host.strip("[]"), int(port)), timeout=deadline_s)


def _read_line(sock: socket.socket) -> bytes:
    data = b""
    while b"\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
        if len(data) > MAX_LINE:
            break
    return data.split(b"\n", 1)[0]


def wait_for_go(environ: MutableMapping[str, str]) -> Optional[Gate]:
    """Pass the gate (module docstring): returns the open Gate once the launcher said go, with its variables
    in ``environ``; exits the process (STOP_EXIT) when it said stop, or (2) when it cannot be reached or
    answers wrongly. None when there is no gate (GATE unset) or it was passed before this re-exec."""
    where = environ.pop(GATE, "")
    key_hex = environ.pop(GATE_KEY, "")
    args_text = environ.pop(GATE_PROBE, "")
    if not where or environ.get(GATE_PASSED):
        return None
    me = f"gaudi-launch worker (rank {environ.get('RANK', '?')} on {socket.gethostname()})"
    try:
        key = bytes.fromhex(key_hex)
        args = json.loads(args_text)
    except ValueError:
        print(f"{me}: the launcher's gate variables are malformed", file=sys.stderr)
        sys.exit(2)
    host, rank = socket.gethostname(), environ.get("RANK", "")
    # the host's lock before the verdict: a rank that ends at once (its script done) must see its host's other
    # ranks still waiting for theirs, not take itself for the last one and sweep them
    lock_fd = _hold_host_lock(environ)
    shared = _job_dir(environ)  # where the host's first rank leaves the verdict for the others
    if shared is not None and environ.get("LOCAL_RANK") != "0":
        nonce, line = _left_verdict(shared, me)
        sock = None
    else:
        probe = probe_here(args, environ) if environ.get("LOCAL_RANK") == "0" else None
        nonce = _nonce()
        try:
            sock = _connect(where)
            sock.sendall(hello(key, rank, host, probe, nonce))
            sock.settimeout(None)  # the verdict comes once every host answered (or the launcher gave up on one)
            line = _read_line(sock)
        except OSError as exc:
            print(f"{me}: cannot reach the launcher at {where} ({exc}); not starting", file=sys.stderr)
            sys.exit(2)
        if shared is not None and line:
            _leave_verdict(shared, nonce, line, me)
    answer = read_verdict(key, nonce, line) if line else None
    if answer is None:
        print(
            f"{me}: {'no' if not line else 'a wrong'} answer from the launcher at {where}; not starting",
            file=sys.stderr,
        )
        sys.exit(2)
    if not answer.get("go"):
        sys.exit(STOP_EXIT)  # the launcher prints the pre-flight's table
    env = {str(k): str(v) for k, v in answer["env"].items()}
    environ[GATE_PASSED] = "1"
    gate = Gate(sock, key, nonce, host, where=where, rank=rank, lock_fd=lock_fd)
    if any(env.get(k, environ.get(k)) != environ.get(k) for k in _STARTUP_VARS):
        environ.update(env)
        # the loader and the interpreter read these at start-up: run again with them (the gate passed; this
        # connection closes with the old image, and the launcher sweeps this host itself)
        os.execve(
            sys.executable, [sys.executable, "-u", "-m", "gaudi_launch.process.worker", *sys.argv[1:]], dict(environ)
        )
    environ.update(env)
    return gate


def _nonce() -> str:
    return os.urandom(16).hex()  # what secrets.token_hex reads, without its imports (random, base64)


def _job_dir(environ: Mapping[str, str]) -> Optional[str]:
    """The job's directory on this host (the ranks' lock file and the left verdict), or None without a job id."""
    job = environ.get(JOB_ID, "")
    return rank_dir(job, environ) if job else None


def _host_tag() -> str:
    # files per hostname: a job directory hosts share (NFS TMPDIR) still gives each host its own
    return "".join(c if c.isalnum() or c in "-." else "_" for c in socket.gethostname())


def _verdict_name() -> str:
    return f"verdict-{_host_tag()}.json"


def _private_dir_fd(directory: str) -> int:
    """A descriptor of the job's directory, made if missing: only when it is ours and private (OSError or
    ValueError otherwise; wire.open_private_dir)."""
    try:
        os.mkdir(directory, 0o700)
    except FileExistsError:
        pass
    return open_private_dir(directory)


def _open_job_dir(directory: str, me: str) -> int:
    try:
        return _private_dir_fd(directory)
    except (OSError, ValueError) as exc:
        print(f"{me}: the job's directory cannot hold the launcher's verdict for this host ({exc})", file=sys.stderr)
        sys.exit(2)


def _leave_verdict(directory: str, nonce: str, line: bytes, me: str) -> None:
    """The first rank: the verdict line as the launcher signed it (bound to this rank's nonce), for the host's
    other ranks; whole or not at all (written beside, then renamed)."""
    dir_fd = _open_job_dir(directory, me)
    name = _verdict_name()
    try:
        fd = create_private(f"{name}.{os.getpid()}", dir_fd, exclusive=True)
        with os.fdopen(fd, "wb") as f:
            f.write(json.dumps({"nonce": nonce, "line": line.decode("utf-8", "replace")}).encode())
        os.rename(f"{name}.{os.getpid()}", name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except OSError as exc:
        print(f"{me}: cannot leave the launcher's verdict for this host's other ranks ({exc})", file=sys.stderr)
        sys.exit(2)
    finally:
        os.close(dir_fd)


def _left_verdict(directory: str, me: str) -> tuple[str, bytes]:
    """Another rank: (nonce, line) the host's first rank left, once it is there. Checked by the caller as the
    first rank checks it (the MAC over that nonce, with this rank's key): a file nobody else can write, and no
    verdict without the key. Waits as the first rank waits for the launcher: mpirun ends the job if it fails."""
    dir_fd = _open_job_dir(directory, me)
    try:
        while True:
            try:
                fd = os.open(_verdict_name(), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
            except FileNotFoundError:
                time.sleep(VERDICT_POLL_S)
                continue
            with os.fdopen(fd, "rb") as f:
                data = f.read(MAX_LINE + 4096)
            try:
                left = json.loads(data)
                return str(left["nonce"]), str(left["line"]).encode()
            except (ValueError, KeyError, TypeError):
                return "", b"?"  # read_verdict refuses it: "a wrong answer"
    except OSError as exc:
        print(f"{me}: cannot read the launcher's verdict for this host ({exc})", file=sys.stderr)
        sys.exit(2)
    finally:
        os.close(dir_fd)


def _lock_path(environ: Mapping[str, str]) -> Optional[str]:
    directory = _job_dir(environ)  # one lock per host (_host_tag): each host its own last rank
    return os.path.join(directory, f"ranks-{_host_tag()}.lock") if directory else None


def _hold_host_lock(environ: Mapping[str, str]) -> Optional[int]:
    """A shared lock on the job's lock file on this host, held while the rank runs: the last rank to let go
    of it (its exclusive lock then succeeds) sweeps the host. In the job's directory only if it is ours and
    private (wire.open_private_dir), its files made relative to it, never through a link (wire.create_private)."""
    path = _lock_path(environ)
    if path is None:
        return None
    directory, name = os.path.split(path)
    try:
        dir_fd = _private_dir_fd(directory)
    except (OSError, ValueError):
        return None  # no sweep by the ranks here: the launcher's covers this host
    try:
        fd = create_private(name, dir_fd)
        fcntl.flock(fd, fcntl.LOCK_SH)
        os.close(create_private(f"{name}.{os.getpid()}", dir_fd))  # the last rank waits for this one to be gone
        return fd
    except OSError:
        return None
    finally:
        os.close(dir_fd)


def at_exit(gate: Optional[Gate], job: str) -> None:
    """The rank's end: the last rank of the job on this host sweeps what the job left here and tells the
    launcher (which then sweeps only the hosts that did not say so)."""
    if gate is None or gate.lock_fd is None or not job:
        return
    fd, gate.lock_fd = gate.lock_fd, None
    try:
        fcntl.flock(fd, fcntl.LOCK_UN)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)  # another rank of this host still runs: the last one sweeps
        return

    # every other rank of the job here let go of the lock: it is in its last steps; the sweep (which spares only
    # this process) must not end one of them before it exited by itself (mpirun would take it for a failure)
    path = _lock_path({**os.environ, JOB_ID: job}) or ""
    others = (
        [n for n in os.listdir(os.path.dirname(path)) if n.startswith(os.path.basename(path) + ".")] if path else []
    )
    expected = os.environ.get("LOCAL_WORLD_SIZE", "")
    if expected.isdigit() and len(others) < int(expected):  # a rank of this host has not reached its gate yet
        os.close(fd)  # (the launcher's sweep covers this host)
        return
    end = time.monotonic() + 5.0
    for name in others:
        pid = name.rsplit(".", 1)[1]
        while pid != str(os.getpid()) and _alive(pid) and time.monotonic() < end:
            time.sleep(0.01)
    try:
        os.environ[SWEEP_OWN_UTS] = "1"  # (teardown.KILL_CODE: this host's processes only)
        found = sweep_here(job, signal.SIGKILL)
        gate.swept(max(found.hit, 0))
    except Exception:
        pass
    finally:
        os.close(fd)


def _alive(pid: str) -> bool:
    """The process runs (a zombie has exited). Pure but for /proc."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False
