"""The job's shared ssh connections (sshmux.py) and how mpirun's argv uses them: the pure parts."""
from __future__ import annotations

import os
import stat

import pytest

from gaudi_launch import sshmux
from gaudi_launch.backends import mpirun


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
        assert "ControlMaster=yes" in argv and f"ControlPersist={sshmux.PERSIST_S}" in argv
        assert conn.hosts == ["h1"]
        with pytest.raises(FileExistsError):  # a directory that exists is never taken over
            sshmux.Connections("feedf00d", [], tmp=str(tmp_path))
    finally:
        conn.close()
    assert not os.path.exists(conn.dir) and sshmux.for_job("feedf00d") is None
    conn.close()  # idempotent


def test_mpirun_daemons_go_over_the_connections_without_tree_spawn():
    argv = ["mpirun", "-n", "2", "--host", "a:1,b:1", "--mca", "plm_rsh_args", "-o BatchMode=yes -F /c", "/bin/true"]
    out = mpirun.over_connections(argv, ["-o", "ControlPath=/tmp/d/%C", "-o", "ControlMaster=no"])
    i = out.index("plm_rsh_args")
    assert out[i + 1] == "-o BatchMode=yes -F /c -o ControlPath=/tmp/d/%C -o ControlMaster=no"
    assert out[i + 2:i + 5] == ["--mca", "plm_rsh_no_tree_spawn", "1"]
    assert out[-1] == "/bin/true" and argv[argv.index("plm_rsh_args") + 1] == "-o BatchMode=yes -F /c"
    bare = mpirun.over_connections(["mpirun", "/bin/true"], ["-o", "ControlPath=/tmp/d/%C"])
    assert bare[1:3] == ["--mca", "plm_rsh_args"] and bare[-1] == "/bin/true"


def test_the_sweep_runs_through_the_kept_session(tmp_path):
    """The pre-flight's session ends as teardown.AGENT_CODE: a sweep is one line to it, no new ssh."""
    import subprocess
    import sys

    from gaudi_launch import teardown

    job = "abad1dea"
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                              env={"GAUDI_LAUNCH_JOB_ID": job, "PATH": "/usr/bin:/bin"})
    conn = sshmux.Connections("c0ffee00", [], tmp=str(tmp_path))
    try:
        agent = subprocess.Popen([sys.executable, "-S", "-u", "-c", teardown.AGENT_CODE], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        conn.adopt("h1", agent)
        assert conn.agent_run("h1", teardown.kill_args(job, 0), 10).splitlines()[0] == "1"  # found, signal 0
        swept = teardown.sweep_job(["h1"], job, 15, ssh_args=["-o", "BatchMode=yes"], python="/nowhere/python",
                                   is_local=lambda h: False, via=conn.agent_run)
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
    for d in (old_empty, young_empty, old_full, other):
        d.mkdir(mode=0o700)
    (old_full / "socket").write_text("")
    past = time.time() - 10 * sshmux.PERSIST_S
    for d in (old_empty, old_full, other):
        os.utime(d, (past, past))
    conn = sshmux.Connections("fedcba98", [], tmp=str(tmp_path))
    try:
        assert not old_empty.exists()
        assert young_empty.exists() and old_full.exists() and other.exists()
        assert conn.dir.startswith(str(tmp_path))
    finally:
        conn.close()
        shutil.rmtree(tmp_path)
