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
