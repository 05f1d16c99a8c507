"""Issue 27 (items 1, 3, 7, 14): what another user of the same host can reach of the files and sockets
a job writes: the heartbeat directory on a rank's host, --log-dir's hang report, ``gaudi-launch report``'s
plots, a new --log-dir's modes, the rsh agent's socket. The other user is real: uid 65534, in a forked
child (root in CI); a teammate is uid 65534 with our group."""

from __future__ import annotations

import os
import pathlib
import secrets
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import traceback
from itertools import count

import pytest

from gaudi_launch.process.hangs import HangWatch
from gaudi_launch.remote import sshmux
from gaudi_launch.reports import plots
from tests.integration.test_hardening import gaudi_launch, printer
from tests.unit.reports.test_plots import needs_matplotlib

OTHER = 65534


def needs_root():
    if os.geteuid() != 0:
        if os.environ.get("CI") == "true":
            pytest.fail("needs root to act as another user")
        pytest.skip("needs root to act as another user")


def as_other_user(action, groups=()) -> bytes:
    """What ``action()`` returns (bytes) when uid/gid 65534 runs it, with supplementary ``groups``."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            os.close(read)
            os.setgroups(list(groups))
            os.setgid(OTHER)
            os.setuid(OTHER)
            os.write(write, action() or b"")
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as f:
        out = f.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the other user's part failed (see stderr)"
    return out


def victim(tmp_path, name="victim"):
    """A root-owned file with known content and time, which nothing of ours may touch."""
    path = tmp_path / name
    path.write_text("precious\n")
    os.utime(path, (1e9, 1e9))
    return path


def untouched(path) -> bool:
    return path.read_bytes() == b"precious\n" and os.stat(path).st_mtime == 1e9


@pytest.fixture
def reachable(request):
    """A directory the other user can pass through (pytest's tmp_path is 0700 root's)."""
    path = tempfile.mkdtemp(prefix="gl-shared-")
    os.chmod(path, 0o755)
    request.addfinalizer(lambda: shutil.rmtree(path, ignore_errors=True))
    return pathlib.Path(path)


def shared_with_group(path):
    """A directory our group may write to (as --log-dir and a run directory are allowed to be)."""
    path.mkdir()
    os.chmod(path, 0o770)
    os.chown(path, 0, os.getegid())
    return path


# ---- item 1: a heartbeat directory someone else made on a rank's host -------------------------------

HEARTBEAT_RANK = "import gaudi_launch\ngaudi_launch.heartbeat()\ngaudi_launch.heartbeat()\nprint('ran')\n"


def bootstrap(tmp_path, heartbeat_dir):
    """The rank bootstrap as a remote host runs it under --hang-timeout (mpirun, DeepSpeed's runner)."""
    script = tmp_path / "rank.py"
    script.write_text(HEARTBEAT_RANK)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GAUDI_LAUNCH_")}
    env.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", GAUDI_LAUNCH_HEARTBEAT_DIR=str(heartbeat_dir))
    return subprocess.run(
        [sys.executable, "-m", "gaudi_launch.process.worker", str(script)],
        env=env,
        cwd=str(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_heartbeat_directory_planted_by_another_user_is_not_written_through(tmp_path, request):
    needs_root()
    target = victim(tmp_path)
    # The name another user reads in the launcher host's /tmp, made first on a rank's host.
    planted = f"/tmp/gaudi-launch-{secrets.token_hex(8)}"
    request.addfinalizer(lambda: shutil.rmtree(planted, ignore_errors=True))

    def plant():
        os.mkdir(planted)
        os.chmod(planted, 0o777)
        for kind in ("stack", "beat", "pid"):
            os.symlink(target, os.path.join(planted, f"rank-0.{kind}"))

    as_other_user(plant)
    res = bootstrap(tmp_path, planted)
    assert res.returncode == 0 and res.stdout == "ran\n", res.stderr
    assert untouched(target)
    assert sorted(os.listdir(planted)) == ["rank-0.beat", "rank-0.pid", "rank-0.stack"]
    assert all(os.path.islink(os.path.join(planted, n)) for n in os.listdir(planted))
    assert f"gaudi-launch: rank 0: {planted} belongs to uid {OTHER} with mode 777" in res.stderr, res.stderr


def test_the_launchers_private_heartbeat_directory_gets_private_files(tmp_path):
    directory = tmp_path / "heartbeats"
    directory.mkdir(mode=0o700)
    res = bootstrap(tmp_path, directory)
    assert res.returncode == 0 and res.stdout == "ran\n" and res.stderr == "", res.stderr
    assert sorted(os.listdir(directory)) == ["rank-0.beat", "rank-0.pid", "rank-0.stack"]
    for name in os.listdir(directory):
        st = os.lstat(directory / name)
        assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600, (name, oct(st.st_mode))
    host, pid, started = (directory / "rank-0.pid").read_text().split()
    assert host == socket.gethostname() and int(pid) > 0 and int(started) > 0


# ---- item 3: the hang report and gaudi-launch report's files, in a directory our group shares -------


def test_the_hang_report_is_not_written_through_a_teammates_link(tmp_path, reachable):
    needs_root()
    logs, target = shared_with_group(reachable / "logs"), victim(tmp_path)
    as_other_user(lambda: os.symlink(target, logs / "hang-0123abcd.txt"), groups=[os.getegid()])
    beats = tmp_path / "beats"
    beats.mkdir(mode=0o700)
    watch = HangWatch(1.0, str(beats), log_dir=str(logs), clock=count(0, 50).__next__)
    watch.begin(1, "0123abcd")
    summary = watch.check()
    refused = (
        f"(every rank's stacks not kept: cannot write {logs}/hang-0123abcd.txt: it is a symbolic link (not followed))"
    )
    assert summary is not None and summary.endswith(refused), summary
    assert watch.stacks_file is None and untouched(target) and os.path.islink(logs / "hang-0123abcd.txt")


def run_dir(tmp_path):
    run = shared_with_group(tmp_path / "run")
    (run / "metrics.jsonl").write_text(
        "".join(f'{{"step": {s}, "loss": {3.0 / s}, "samples_per_second": 10.0}}\n' for s in range(1, 6))
    )
    return run


def test_reports_files_replace_a_teammates_links_instead_of_following_them(tmp_path, reachable, capsys):
    needs_root()
    needs_matplotlib()
    run = run_dir(reachable)
    png, html = victim(tmp_path, "png-victim"), victim(tmp_path, "html-victim")

    def plant():
        os.mkdir(run / "plots")
        os.symlink(png, run / "plots" / "loss.png")
        os.symlink(html, run / "plots" / "report.html")

    as_other_user(plant, groups=[os.getegid()])
    assert plots.main([str(run)]) == 0, capsys.readouterr().err
    assert untouched(png) and untouched(html)
    for name in ("loss.png", "report.html"):
        st = os.lstat(run / "plots" / name)
        assert stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and st.st_size > 1000, name
    assert (run / "plots" / "loss.png").read_bytes()[:4] == b"\x89PNG"


def test_report_refuses_a_plots_directory_that_is_a_teammates_link(tmp_path, reachable, capsys):
    needs_root()
    needs_matplotlib()
    run, elsewhere = run_dir(reachable), tmp_path / "elsewhere"
    elsewhere.mkdir()
    as_other_user(lambda: os.symlink(elsewhere, run / "plots"), groups=[os.getegid()])
    assert plots.main([str(run)]) == 2
    err = capsys.readouterr().err
    assert f"gaudi-launch report: error: {run}/plots is a symbolic link" in err and "--out" in err, err
    assert os.listdir(elsewhere) == []


# ---- item 7: a new --log-dir and what is written in it are private ------------------------------------


def test_a_new_log_dir_is_0700_and_its_logs_0600(tmp_path):
    logs = tmp_path / "new" / "logs"
    res = gaudi_launch("--num_devices", "2", "--log-dir", str(logs), printer(tmp_path), cwd=str(tmp_path))
    assert res.returncode == 0, res.stderr
    assert stat.S_IMODE(os.stat(logs).st_mode) == 0o700
    assert sorted(os.listdir(logs)) == ["rank-0.log", "rank-1.log"]
    assert {stat.S_IMODE(os.stat(logs / n).st_mode) for n in os.listdir(logs)} == {0o600}


def test_an_existing_log_dir_keeps_its_mode(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir(mode=0o750)
    os.chmod(logs, 0o750)
    res = gaudi_launch("--num_devices", "1", "--log-dir", str(logs), printer(tmp_path), cwd=str(tmp_path))
    assert res.returncode == 0, res.stderr
    assert stat.S_IMODE(os.stat(logs).st_mode) == 0o750


def test_the_hang_report_is_private(tmp_path):
    beats, logs = tmp_path / "beats", tmp_path / "logs"
    beats.mkdir(mode=0o700)
    watch = HangWatch(1.0, str(beats), log_dir=str(logs), clock=count(0, 50).__next__)
    watch.begin(2, "0123abcd")
    watch.check()
    assert watch.stacks_file == str(logs / "hang-0123abcd.txt")
    assert stat.S_IMODE(os.stat(logs).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(watch.stacks_file).st_mode) == 0o600


# ---- item 14: the rsh agent's socket ------------------------------------------------------------------


def ask(path: str) -> bytes:
    """rshagent.py's request for a host without a session; the launcher's whole answer."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(path)
        chunks = []
        try:
            s.sendall(b"h9\0orted -mca x\n")
            s.shutdown(socket.SHUT_WR)
            while True:
                chunk = s.recv(4096)
                if not chunk:
                    break
                chunks.append(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass  # closed on us
        return b"".join(chunks)


def test_the_rsh_socket_is_0600_whatever_the_umask(tmp_path):
    old = os.umask(0)
    try:
        conn = sshmux.Connections(secrets.token_hex(4), [], tmp=str(tmp_path))
        try:
            path = conn.serve_rsh()
            assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        finally:
            conn.close()
    finally:
        os.umask(old)


def test_the_rsh_socket_answers_only_its_own_user(reachable, capsys):
    needs_root()
    conn = sshmux.Connections(secrets.token_hex(4), [], tmp=str(reachable))
    try:
        path = conn.serve_rsh()
        os.chmod(conn.dir, 0o755)  # both barriers before it gone: the directory's mode and the socket's
        os.chmod(path, 0o777)
        assert as_other_user(lambda: ask(path)) == b""  # closed unanswered: nothing run, nothing said
        assert ask(path) == b"fallback\n"  # this user (no session for h9: mpirun's own ssh)
        assert f"rsh socket {path} refused a request from uid {OTHER}" in capsys.readouterr().err
    finally:
        conn.close()
