"""The job's shared ssh connections (sshmux.py) and how mpirun's argv uses them: the pure parts."""

from __future__ import annotations

import contextlib
import os
import stat

import pytest

from gaudi_launch.backends import mpirun
from gaudi_launch.remote import sshmux


def test_control_dir_fits_the_unix_socket_limit(tmp_path):
    path = sshmux.control_dir("0123abcd", str(tmp_path))
    # ssh binds PATH/<40 hex>.<16 random> first: all of it within sun_path's 108 bytes
    assert len(os.path.join(path, "x" * 40 + "." + "y" * 16).encode()) < 108
    long = "/" + "d" * 80
    assert sshmux.control_dir("0123abcd", long) == "/tmp/gaudi-launch-0123abcd-ssh"


def test_connections_own_a_private_directory_and_close_removes_it(tmp_path):
    conn = sshmux.Connections("feedf00d", ["-F", "/cfg"], tmp=str(tmp_path))
    try:
        assert stat.S_IMODE(os.stat(conn.dir).st_mode) == 0o700
        assert sshmux.for_job("feedf00d") is conn
        assert conn.client_args() == ["-o", f"ControlPath={conn.dir}/%C", "-o", "ControlMaster=no"]
        argv = conn.master_argv("h1", "echo hi")
        assert argv[:3] == ["ssh", "-F", "/cfg"] and argv[-2:] == ["h1", "echo hi"]
        assert "ControlMaster=yes" in argv and not any(a.startswith("ControlPersist") for a in argv)
        assert conn.hosts == ["h1"]
        with pytest.raises(FileExistsError):  # a directory that exists is never taken over
            sshmux.Connections("feedf00d", [], tmp=str(tmp_path))
    finally:
        conn.close()
    assert not os.path.exists(conn.dir) and sshmux.for_job("feedf00d") is None
    conn.close()  # idempotent


def test_a_job_run_first_borrows_the_connections_and_gives_them_back(tmp_path):
    # the collective check runs over the job's pre-flight connections; its end must not close them
    conn = sshmux.Connections("cafe0001", ["-F", "/cfg"], tmp=str(tmp_path))
    try:
        with sshmux.lent("cafe0001", "cafe0002"):
            borrowed = sshmux.for_job("cafe0002")
            assert borrowed is not None and borrowed.client_args() == conn.client_args()
            borrowed.close()  # what the check job's backend does at its end
            assert sshmux.for_job("cafe0002") is None
        assert sshmux.for_job("cafe0001") is conn and not conn.closed and os.path.isdir(conn.dir)
        with sshmux.lent("no-such-job", "cafe0003"):  # no pre-flight connections: the check makes its own ssh
            assert sshmux.for_job("cafe0003") is None
    finally:
        conn.close()


def test_mpirun_daemons_go_over_the_connections_without_tree_spawn():
    argv = ["mpirun", "-n", "2", "--host", "a:1,b:1", "--mca", "plm_rsh_args", "-o BatchMode=yes -F /c", "/bin/true"]
    out = mpirun.over_connections(argv, ["-o", "ControlPath=/tmp/d/%C", "-o", "ControlMaster=no"])
    i = out.index("plm_rsh_args")
    assert out[i + 1] == "-o BatchMode=yes -F /c -o ControlPath=/tmp/d/%C -o ControlMaster=no"
    assert out[i + 2 : i + 5] == ["--mca", "plm_rsh_no_tree_spawn", "1"]
    assert out[-1] == "/bin/true" and argv[argv.index("plm_rsh_args") + 1] == "-o BatchMode=yes -F /c"
    bare = mpirun.over_connections(["mpirun", "/bin/true"], ["-o", "ControlPath=/tmp/d/%C"])
    assert bare[1:3] == ["--mca", "plm_rsh_args"] and bare[-1] == "/bin/true"


def test_the_sweep_runs_through_the_kept_session(tmp_path):
    """The pre-flight's session ends as teardown.AGENT_CODE: a sweep is one line to it, no new ssh."""
    import subprocess
    import sys

    from gaudi_launch.remote import teardown

    job = "abad1dea"
    victim = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], env={"GAUDI_LAUNCH_JOB_ID": job, "PATH": "/usr/bin:/bin"}
    )
    conn = sshmux.Connections("c0ffee00", [], tmp=str(tmp_path))
    try:
        agent = subprocess.Popen(
            [sys.executable, "-S", "-u", "-c", teardown.AGENT_CODE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        conn.adopt("h1", agent)
        assert conn.agent_run("h1", teardown.kill_args(job, 0), 10).splitlines()[0] == "1"  # found, signal 0
        swept = teardown.sweep_job(
            ["h1"],
            job,
            15,
            ssh_args=["-o", "BatchMode=yes"],
            python="/nowhere/python",
            is_local=lambda h: False,
            via=conn.agent_run,
        )
        assert swept["h1"].hit == 1  # through the agent: the ssh fallback (to host h1) would have failed
        assert victim.wait(10) == -15
        assert conn.agent_run("nohost", ["x", "0"], 1) is None  # no agent there: the caller uses ssh
    finally:
        if victim.poll() is None:
            victim.kill()
        conn.close()
    assert agent.poll() is not None  # closing the connections ends the agent (end of its input)


def test_a_sigkilled_launchers_empty_directory_is_removed_at_the_next_start():
    import shutil
    import tempfile
    import time
    from pathlib import Path

    tmp_path = Path(tempfile.mkdtemp(prefix="glm", dir="/tmp"))  # short: the sockets' directory goes in it
    old_empty = tmp_path / "gaudi-launch-0123abcd-ssh"
    young_empty = tmp_path / "gaudi-launch-4567abcd-ssh"
    old_full = tmp_path / "gaudi-launch-89abcdef-ssh"
    other = tmp_path / "gaudi-launch-0123abcd"  # a DeepSpeed job directory: jobdir's to handle
    old_rsh = tmp_path / "gaudi-launch-76543210-ssh"  # left by a SIGKILLed launcher: its rsh socket, deaf
    live_rsh = tmp_path / "gaudi-launch-fedc0123-ssh"  # a job still running: its launcher listens there
    for d in (old_empty, young_empty, old_full, other, old_rsh, live_rsh):
        d.mkdir(mode=0o700)
    (old_full / "socket").write_text("")
    import socket

    deaf = socket.socket(socket.AF_UNIX)
    deaf.bind(str(old_rsh / sshmux.RSH_SOCKET))
    deaf.close()  # the socket file stays, with nobody behind it
    listening = socket.socket(socket.AF_UNIX)
    listening.bind(str(live_rsh / sshmux.RSH_SOCKET))
    listening.listen(1)
    past = time.time() - 10 * sshmux.PERSIST_S
    for d in (old_empty, old_full, other, old_rsh, live_rsh):
        os.utime(d, (past, past))
    conn = sshmux.Connections("fedcba98", [], tmp=str(tmp_path))
    try:
        assert not old_empty.exists() and not old_rsh.exists()
        assert young_empty.exists() and old_full.exists() and other.exists()
        assert (live_rsh / sshmux.RSH_SOCKET).exists()
        assert conn.dir.startswith(str(tmp_path))
    finally:
        listening.close()
        conn.close()
        shutil.rmtree(tmp_path)


def _session_agent(env=None):
    """sshmux.SESSION_AGENT as the pre-flight leaves it running, here as a local process."""
    import subprocess
    import sys

    return subprocess.Popen(
        [sys.executable, "-S", "-u", "-c", sshmux.SESSION_AGENT],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )


def test_the_session_runs_a_command_as_sshd_would(tmp_path):
    """{"run": ...}: the user's shell with -c, from the home directory, its exit status and output;
    a shell nested in the session's (SHLVL one up: bash skips ~/.bashrc, which the session ran)."""
    home = tmp_path / "home"
    home.mkdir()
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "SHELL": "/bin/sh", "SHLVL": "0", "MARK": "m1"}
    conn = sshmux.Connections("d00dfeed", [], tmp=str(tmp_path))
    try:
        conn.adopt("u@h1", _session_agent(env))
        res = conn.run_command("u@h1", 'echo "$MARK $SHLVL $(pwd)"; echo oops >&2; exit 7')
        assert res == {"rc": 7, "out": f"m1 1 {home}\n", "err": "oops\n"}
        assert conn.run_command("u@h1", "kill -9 $$")["rc"] == 255  # died of a signal: ssh says 255
        assert conn.run_command("u@h1", "printf '\\377\\001'")["out"].encode("latin-1") == b"\xff\x01"
        # a daemon that leaves a child behind holding nothing of ours does not keep the answer waiting
        res = conn.run_command("u@h1", "sleep 30 </dev/null >/dev/null 2>&1 & echo $!", timeout=10)
        assert res["rc"] == 0
        os.kill(int(res["out"]), 9)
        assert conn.agent_for("h1") == "u@h1" and conn.agent_for("h2") is None
        assert conn.run_command("h2", "true") is None  # no session there: the caller uses ssh
        assert conn.daemons_started == {"u@h1": 4}
    finally:
        conn.close()


def _rsh(conn, tmp_path, *args):
    import subprocess
    import sys

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake_ssh = bin_dir / "ssh"  # the fallback: prints what it was given
    fake_ssh.write_text('#!/bin/sh\necho "ssh $*"\nexit 5\n')
    fake_ssh.chmod(0o755)
    agent = conn.rsh_agent(2).split()
    assert agent[:4] == [sys.executable, "-S", "-I", sshmux.RSH_AGENT] and agent[-2:] == [conn.rsh_socket(), "2"]
    return subprocess.run(
        [*agent, "-o", "BatchMode=yes", *args],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"},
    )


def test_mpiruns_rsh_agent_starts_daemons_through_the_sessions(tmp_path):
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "SHELL": "/bin/sh"}
    conn = sshmux.Connections("beadfeed", ["-F", "/cfg"], tmp=str(tmp_path))
    try:
        conn.adopt("h1", _session_agent(env))
        conn.serve_rsh()
        # mpirun's words: quoted for the remote shell, joined with spaces as ssh joins them
        done = _rsh(conn, tmp_path, "h1", "echo", '"a b"', "; echo err >&2; exit 3")
        assert (done.returncode, done.stdout, done.stderr) == (3, "a b\n", "err\n")
        assert conn.daemons_started == {"h1": 1}
        # a host without a session: mpirun's own ssh (with its -x), over the options given
        done = _rsh(conn, tmp_path, "h2", "orted", "-mca", "x")
        assert (done.returncode, done.stdout) == (5, "ssh -x -o BatchMode=yes h2 orted -mca x\n")
    finally:
        conn.close()
    assert not os.path.exists(conn.rsh_socket())
    done = _rsh(conn, tmp_path, "h1", "true")  # no launcher to ask: ssh, and nothing was run twice
    assert (done.returncode, done.stdout) == (5, "ssh -x -o BatchMode=yes h1 true\n")


def test_the_rsh_agent_is_left_out_when_mpirun_would_split_its_paths(tmp_path, monkeypatch):
    conn = sshmux.Connections("cafef00d", [], tmp=str(tmp_path))
    try:
        assert conn.rsh_agent(3).endswith(" 3")
        monkeypatch.setattr(sshmux.sys, "executable", "/opt/my python/bin/python")
        assert conn.rsh_agent(3) is None
    finally:
        conn.close()


def test_mpirun_daemons_through_the_sessions_argv():
    argv = mpirun.over_connections(
        ["mpirun", "--mca", "plm_rsh_args", "-F /c", "/bin/true"],
        ["-o", "ControlPath=/tmp/d/%C", "-o", "ControlMaster=no"],
    )
    seen = []

    def agent(n):
        seen.append(n)
        return "/py -S -I /a.py /tmp/d/rsh 6"

    out = mpirun.through_sessions(argv, agent)
    assert seen == [6]  # -F /c -o ControlPath=... -o ControlMaster=no
    i = out.index("plm_rsh_agent")
    assert out[i - 1] == "--mca" and out[i + 1] == "/py -S -I /a.py /tmp/d/rsh 6"
    assert out[out.index("plm_rsh_args") + 1] == "-F /c -o ControlPath=/tmp/d/%C -o ControlMaster=no"
    assert out[-1] == "/bin/true" and len(out) == len(argv) + 3
    assert mpirun.through_sessions(argv, lambda n: None) == argv


def test_rsh_agent_arguments_and_answers():
    from gaudi_launch.remote import rshagent

    assert rshagent.split(["/s", "2", "-o", "X=y", "h1", "orted", "-mca"]) == (
        "/s",
        ["-o", "X=y"],
        "h1",
        ["orted", "-mca"],
    )
    assert rshagent.split(["/s", "0", "h1", "true"]) == ("/s", [], "h1", ["true"])
    for bad in (["/s", "3", "-o", "X", "h1"], ["/s", "x", "h1", "true"], ["/s"]):
        with pytest.raises(ValueError):
            rshagent.split(bad)
    assert rshagent.parse_answer(b"fallback\n") == "fallback"
    assert rshagent.parse_answer(b"3 2 1\nab\xff") == (3, b"ab", b"\xff")
    assert rshagent.parse_answer(b"0 0 0\n") == (0, b"", b"")
    for cut in (b"", b"3 2 1\nab", b"3 2\nab", b"nonsense\n"):
        assert rshagent.parse_answer(cut) is None


def test_a_daemon_start_that_hangs_neither_blocks_the_sweep_nor_outlives_the_job(tmp_path):
    """mpirun's daemon start through a host's session that never returns (an orted that hangs): the
    sweep does not queue behind it (it falls back to a new ssh at once), starting() names the host
    for the start-up deadline's message, and closing the job's connections ends the hung command."""
    import threading
    import time

    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "SHELL": "/bin/sh"}
    conn = sshmux.Connections("deadbeef", [], tmp=str(tmp_path))
    pid_file = tmp_path / "hung.pid"
    try:
        conn.adopt("u@h1", _session_agent(env))
        start = threading.Thread(target=conn.run_command, args=("u@h1", f"echo $$ > {pid_file}; exec sleep 300"))
        start.start()
        deadline = time.monotonic() + 10
        while not (pid_file.exists() and pid_file.read_text().strip()) and time.monotonic() < deadline:
            time.sleep(0.05)
        hung = int(pid_file.read_text())
        assert conn.starting() == ["u@h1"]
        t0 = time.monotonic()
        assert conn.agent_run("u@h1", ["x", "0"], timeout=15) is None
        assert time.monotonic() - t0 < sshmux.BUSY_WAIT_S + 1
        assert mpirun.daemons_not_started(conn.starting()).startswith(
            "mpirun's daemon (orted) never started on u@h1: its start there has not returned. "
            "Run `ssh u@h1 orted --version`"
        )
    finally:
        conn.close()
    start.join(10)
    deadline = time.monotonic() + 5
    while os.path.exists(f"/proc/{hung}") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(f"/proc/{hung}")
    assert conn.starting() == [] and mpirun.daemons_not_started([]) is None


def test_a_daemon_that_dies_after_detaching_is_reported_by_its_session(tmp_path):
    """OpenMPI 4's `orted --daemonize` returns at once (its parent exits) and the daemon carries on
    alone: the session that ran the command adopts it (a child subreaper), and daemons_gone says, per
    host, which adopted daemon ended since and how; one still running, or another host's, is not said."""
    import shlex
    import sys

    from tests.helpers import wait_for

    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "SHELL": "/bin/sh"}
    gate = tmp_path / "gate"
    # as orted --daemonize: forks, the parent exits 0 at once, the child detaches (a session of its own,
    # no stdio of ours); this one then waits for the gate and fails with exit code 3, that one stays
    daemon = (
        "import os, sys, time\n"
        "if os.fork():\n"
        "    os._exit(0)\n"
        "os.setsid()\n"
        "while sys.argv[1] and not os.path.exists(sys.argv[1]):\n"
        "    time.sleep(0.05)\n"
        "time.sleep(0 if sys.argv[1] else 600)\n"
        "sys.exit(3)\n"
    )
    run = f"{shlex.quote(sys.executable)} -S -c {shlex.quote(daemon)}"
    conn = sshmux.Connections("d00dfee1", [], tmp=str(tmp_path))
    try:
        conn.adopt("h1", _session_agent(env))
        conn.adopt("h2", _session_agent(env))
        assert conn.run_command("h1", f"{run} {gate} </dev/null >/dev/null 2>&1")["rc"] == 0
        assert conn.run_command("h2", f"{run} '' </dev/null >/dev/null 2>&1")["rc"] == 0
        name = os.path.basename(sys.executable)[:15]  # the kernel's comm
        assert list(conn.adopted["h1"].values()) == [name] and list(conn.adopted["h2"].values()) == [name]
        assert conn.daemons_gone() == {}  # both still running
        gate.touch()
        assert wait_for(lambda: conn.daemons_gone(), timeout=30)
        [(pid, found)] = conn.daemons_gone()["h1"].items()
        assert pid in conn.adopted["h1"] and found == (name, 3)
        assert list(conn.daemons_gone()) == ["h1"]
        assert list(conn.daemons_gone(skip={"h1"})) == ["h1"]  # what was seen stays said
    finally:
        for pid in conn.adopted.get("h2", {}):
            with contextlib.suppress(OSError):
                os.kill(pid, 9)
        conn.close()


def test_daemons_that_died_are_a_launch_failure_naming_their_hosts():
    assert mpirun.daemons_died({}) is None
    # exit code 0: a daemon ORTE ordered to exit at the job's end (the check raced it), not a failure
    assert mpirun.daemons_died({"h1": {10: ("orted", 0)}}) is None
    text = mpirun.daemons_died({"h2": {12: ("orted", -11)}, "h1": {10: ("orted", 0), 11: ("orted", 1)}, "h3": {}})
    assert text.startswith(
        "mpirun's daemon (orted) died after it detached and before it reported back to mpirun, on "
        "h1 (orted, pid 11, exit code 1); h2 (orted, pid 12, killed by SIGSEGV): mpirun starts no rank until "
        "every daemon has reported, and would have waited for it for ever."
    ), text
    assert "`ssh h1 orted --version`" in text and "OMPI_MCA_orte_debug_daemons=1" in text
    many = mpirun.daemons_died({f"n{i:02d}": {i + 1: ("orted", 1)} for i in range(10)})
    assert "n07 (orted, pid 8, exit code 1) and 2 more host(s):" in many and "n08" not in many
