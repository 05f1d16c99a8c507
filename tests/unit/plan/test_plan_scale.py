"""Plans for very large clusters (issue 18): a 10,000-host x 8 mpirun plan whose argv the kernel
accepts (mpirun reads the hosts from a hostfile in the job's private directory once the list is too
long for one argument), built without running anything."""

from __future__ import annotations

import errno
import os
import stat
import subprocess

import pytest

from gaudi_launch.backends import get_backend, mpirun
from gaudi_launch.inputs.spec import JobSpec
from gaudi_launch.plan.planner import build_plan
from gaudi_launch.remote import jobdir

ARG_MAX_ONE = 128 * 1024  # Linux MAX_ARG_STRLEN


def big_plan(tmp_path, hosts: int, per_host: int = 8):
    hostfile = tmp_path / f"hosts.{hosts}"
    hostfile.write_text("".join(f"node{i:05d}.cluster.example slots={per_host}\n" for i in range(hosts)))
    spec = JobSpec(
        program=["/bin/true"], no_python=True, hostfile=str(hostfile), backend="mpirun", ssh_check=False, efa=False
    )
    return build_plan(spec, environ={"PATH": os.environ.get("PATH", "")}, backends=get_backend)


def harmless(argv):
    """mpirun's argv with mpirun replaced by a program that ignores its arguments."""
    return ["/bin/true", *argv[1:]]


def test_10000_hosts_x_8_argv_execs(tmp_path):
    plan = big_plan(tmp_path, 10_000)
    argv = plan.commands[0].argv
    assert plan.world_size == 80_000
    assert max(len(a.encode()) for a in argv) < ARG_MAX_ONE
    path = argv[argv.index("--hostfile") + 1]
    assert path == os.path.join(jobdir.path_for(plan.job_id), mpirun.HOSTFILE)
    assert "--host" not in argv
    assert subprocess.run(harmless(argv)).returncode == 0  # the kernel takes it: no E2BIG


def test_the_same_hosts_on_one_argument_would_not_exec(tmp_path):
    """Why the hostfile: the `--host` list for these hosts is one argument over Linux's limit."""
    plan = big_plan(tmp_path, 10_000)
    argv = mpirun.build_argv(plan, JobSpec(program=["/bin/true"], no_python=True), version=4, root=False, exported=[])
    assert len(argv[argv.index("--host") + 1]) > ARG_MAX_ONE
    with pytest.raises(OSError) as err:
        subprocess.run(harmless(argv))
    assert err.value.errno == errno.E2BIG


def test_short_lists_stay_on_the_command_line(tmp_path):
    plan = big_plan(tmp_path, 100)
    argv = plan.commands[0].argv
    assert argv[argv.index("--host") + 1].split(",")[:2] == [
        "node00000.cluster.example:8",
        "node00001.cluster.example:8",
    ]
    assert "--hostfile" not in argv and mpirun.write_hostfile(plan) is None


def test_the_hostfile_is_written_private_and_names_every_host(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    plan = big_plan(tmp_path, 3000, per_host=4)
    path = mpirun.write_hostfile(plan)
    assert path is not None and path.startswith(str(tmp_path / "tmp"))
    lines = open(path).read().splitlines()
    assert len(lines) == 3000 and lines[0] == "node00000.cluster.example slots=4"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700


def test_host_key_policy_from_ssh_config_without_parsing_when_unset(tmp_path, monkeypatch):
    """A 1,000-host dry run looked every host up in the ssh config (and imported paramiko) to learn
    that StrictHostKeyChecking is set nowhere; the reader (inputs/sshconfig.py) reads each file once and
    looks hosts up only when a file sets it."""
    import sys

    from gaudi_launch.plan import multinode

    hosts = [f"node{i}" for i in range(1000)]
    inc = tmp_path / "conf.d"
    inc.mkdir()
    (inc / "a.conf").write_text("Host node5*\n    StrictHostKeyChecking=yes\n")
    main = tmp_path / "config"
    main.write_text("# StrictHostKeyChecking ask\nHost *\n    User root\n")
    assert multinode.configured_host_keys(hosts, str(main)) is None
    main.write_text(f"# StrictHostKeyChecking ask\nInclude {inc}/*.conf\nHost *\n    User root\n")
    assert multinode.configured_host_keys(hosts, str(main)) == "yes"
    monkeypatch.setitem(sys.modules, "paramiko", None)  # importing it would fail: never needed here
    main.write_text("Host *\n    User root\n")
    assert multinode.configured_host_keys(hosts, str(main)) is None
