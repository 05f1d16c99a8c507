"""Issue 12 hardening on real processes: bad input is exit 2 and starts nothing, logs cannot be
turned against the user, a failing log never stops the output, tails are bounded, the job-id sweep
runs for the local backend too."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.helpers import all_gone, alive, read_pids, wait_for

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def gaudi_launch(*args, cwd=None, timeout=60, **kwargs):
    return subprocess.run([sys.executable, "-m", "gaudi_launch", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd, **kwargs)


def marker_script(tmp_path):
    """A script that leaves a file behind if it ever runs."""
    script = tmp_path / "train.py"
    script.write_text(f"open({str(tmp_path / 'ran')!r}, 'w').close()\n")
    return str(script)


def assert_refused(res, tmp_path, *expected):
    assert res.returncode == 2, res.stdout + res.stderr
    assert "internal error" not in res.stderr and "Traceback" not in res.stderr
    for text in expected:
        assert text in res.stderr, res.stderr
    assert not (tmp_path / "ran").exists()


# ---- item 11: exit 2, never "internal error", errors name job.yaml:LINE ----------------------------

@pytest.mark.parametrize("yaml_text, expected", [
    ("num_devices: 1\njson: 0\n", "job.yaml:2: json_out is true or false"),
    ("grace: null\n", "job.yaml:1: grace has no value"),
    ("num_devices: 1\nssh_timeout: null\n", "job.yaml:2: ssh_timeout has no value"),
    ("env: [null]\n", "job.yaml:1: env has no value"),
    ("num_devices: 1\nenv:\n  - A=1\n  - NOEQUALS\n", "job.yaml:2: expected KEY=VALUE, got 'NOEQUALS'"),
    ("env: [[1, 2]]\n", "job.yaml:1: env items are NAME=VALUE text"),
])
def test_bad_job_file_values_are_exit_2_naming_the_line(tmp_path, yaml_text, expected):
    (tmp_path / "job.yaml").write_text(yaml_text)
    res = gaudi_launch("--config", "job.yaml", marker_script(tmp_path), cwd=tmp_path)
    assert_refused(res, tmp_path, expected)


@pytest.mark.parametrize("args, expected", [
    (["--num_devices", "100000000000"], "--num_devices: 100000000000 devices per node is more than 65536"),
    (["--ssh-timeout", "inf"], "--ssh-timeout: must be a finite number of seconds, got inf"),
    (["--ssh-timeout", "nan"], "--ssh-timeout: must be a finite number of seconds, got nan"),
    (["--hostfile", "/dev/zero"], "/dev/zero: hostfile is larger than 1048576 bytes"),
    (["--config", "/dev/zero"], "/dev/zero: config file is larger than 1048576 bytes"),
])
def test_out_of_range_options_are_exit_2(tmp_path, args, expected):
    res = gaudi_launch(*args, marker_script(tmp_path), cwd=tmp_path)
    assert_refused(res, tmp_path, expected)


def test_huge_slots_in_a_hostfile_are_exit_2(tmp_path):
    (tmp_path / "hosts").write_text("localhost slots=99999999999\n")
    res = gaudi_launch("--hostfile", "hosts", marker_script(tmp_path), cwd=tmp_path)
    assert_refused(res, tmp_path, "hosts:1: slots=99999999999 is more than 65536")


# ---- item 12: --grace nan ----------------------------------------------------------------------------

@pytest.mark.parametrize("value", ["nan", "inf", "-1"])
def test_grace_must_be_finite_and_nothing_starts(tmp_path, value):
    res = gaudi_launch("--grace", value, marker_script(tmp_path), cwd=tmp_path)
    assert_refused(res, tmp_path, "--grace: ")


def test_grace_zero_still_kills_a_rank_that_ignores_sigterm(tmp_path):
    # The other end of the grace check: a finite grace is honoured and SIGKILL follows.
    rank = os.path.join(ROOT, "tests", "integration", "rank_behaviour.py")
    res = gaudi_launch("--num_devices", "2", "--grace", "0", rank, "--pid-dir", str(tmp_path),
                       "--fail-rank", "0", "--how", "exit:5", "--ignore-term")
    assert res.returncode == 5, res.stderr
    assert "rank 1 (SIGKILL after grace period)" in res.stderr
    assert all_gone(read_pids(tmp_path))


# ---- item 16: IPv6 zone ids --------------------------------------------------------------------------

@pytest.mark.parametrize("line", ["fe80::1%;id slots=1", "[fe80::1%$(reboot)] slots=1", "fe80::1%a/b slots=1"])
def test_ipv6_zone_id_with_odd_characters_is_refused(tmp_path, line):
    (tmp_path / "hosts").write_text("# cluster\n" + line + "\n")
    res = gaudi_launch("--hostfile", "hosts", "--no-ssh-check", marker_script(tmp_path), cwd=tmp_path)
    assert_refused(res, tmp_path, "hosts:2: bad IPv6 zone id")


def test_ipv6_zone_id_naming_an_interface_is_accepted(tmp_path):
    (tmp_path / "hosts").write_text("fe80::1%eth0 slots=1\n[fe80::2%3] slots=1\n")
    res = gaudi_launch("--hostfile", "hosts", "--no-ssh-check", "--dry-run", "--json", marker_script(tmp_path),
                       cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    import json
    assert [n["host"] for n in json.loads(res.stdout)["nodes"]] == ["fe80::1%eth0", "fe80::2%3"]
