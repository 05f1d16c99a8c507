"""Issue 12 hardening on real processes: bad input is exit 2 and starts nothing, logs cannot be
turned against the user, a failing log never stops the output, tails are bounded, the job-id sweep
runs for the local backend too."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.helpers import alive, all_gone, read_pids, wait_for

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def gaudi_launch(*args, cwd=None, timeout=60, **kwargs):
    return subprocess.run(
        [sys.executable, "-m", "gaudi_launch", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        **kwargs,
    )


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


@pytest.mark.parametrize(
    "yaml_text, expected",
    [
        ("num_devices: 1\njson: 0\n", "job.yaml:2: --json is true or false"),
        ("grace: null\n", "job.yaml:1: --grace has no value"),
        ("num_devices: 1\nssh_timeout: null\n", "job.yaml:2: --ssh-timeout has no value"),
        ("env: [null]\n", "job.yaml:1: --env has no value"),
        ("num_devices: 1\nenv:\n  - A=1\n  - 1BAD=x\n", "job.yaml:2: --env invalid variable name '1BAD'"),
        ("env: [[1, 2]]\n", "job.yaml:1: --env takes text, not a nested list or mapping"),
    ],
)
def test_bad_job_file_values_are_exit_2_naming_the_line(tmp_path, yaml_text, expected):
    (tmp_path / "job.yaml").write_text(yaml_text)
    res = gaudi_launch("--config", "job.yaml", marker_script(tmp_path), cwd=tmp_path)
    assert_refused(res, tmp_path, expected)


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--num_devices", "100000000000"], "--num_devices: 100000000000 devices per node is more than 65536"),
        (["--ssh-timeout", "inf"], "--ssh-timeout: must be a finite number of seconds, got inf"),
        (["--ssh-timeout", "nan"], "--ssh-timeout: must be a finite number of seconds, got nan"),
        (["--hostfile", "/dev/zero"], "/dev/zero: hostfile cannot be read: is a character device, not a regular file"),
        (["--config", "/dev/zero"], "/dev/zero: cannot read config file: is a character device, not a regular file"),
    ],
)
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
    res = gaudi_launch(
        "--num_devices",
        "2",
        "--grace",
        "0",
        rank,
        "--pid-dir",
        str(tmp_path),
        "--fail-rank",
        "0",
        "--how",
        "exit:5",
        "--ignore-term",
    )
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
    res = gaudi_launch(
        "--hostfile", "hosts", "--no-ssh-check", "--dry-run", "--json", marker_script(tmp_path), cwd=tmp_path
    )
    assert res.returncode == 0, res.stderr
    import json

    assert [n["host"] for n in json.loads(res.stdout)["nodes"]] == ["fe80::1%eth0", "fe80::2%3"]


# ---- item 5: --log-dir cannot be turned against the user ---------------------------------------------


def printer(tmp_path, lines=3, width=20, code=0):
    script = tmp_path / "printer.py"
    script.write_text(
        "import os, sys\n"
        f"for i in range({lines}):\n"
        f"    print('rank %s line %d ' % (os.environ['RANK'], i) + 'x' * {width})\n"
        f"sys.exit({code})\n"
    )
    return str(script)


def planted(tmp_path, mode):
    """A log directory with mode `mode` holding rank-0.log -> a victim file."""
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    logs = tmp_path / "logs"
    logs.mkdir()
    os.chmod(logs, mode)
    os.symlink(victim, logs / "rank-0.log")
    return logs, victim


def test_log_dir_writable_by_others_is_refused_and_nothing_starts(tmp_path):
    logs, victim = planted(tmp_path, 0o777)
    res = gaudi_launch("--num_devices", "1", "--log-dir", str(logs), marker_script(tmp_path))
    assert_refused(res, tmp_path, f"--log-dir {logs}: the log directory can be written by other users")
    assert victim.read_text() == "precious\n"


def test_log_dir_of_another_user_is_refused(tmp_path):
    if os.geteuid() != 0:
        if os.environ.get("CI") == "true":
            pytest.fail("needs root to create a directory of another user")
        pytest.skip("needs root to create a directory of another user")
    logs, victim = planted(tmp_path, 0o755)
    os.chown(logs, 65534, 65534)
    res = gaudi_launch("--num_devices", "1", "--log-dir", str(logs), marker_script(tmp_path))
    assert_refused(res, tmp_path, "the log directory belongs to another user (uid 65534)")
    assert victim.read_text() == "precious\n"


def test_planted_link_in_a_sticky_dir_of_ours_is_not_followed(tmp_path):
    logs, victim = planted(tmp_path, 0o1777)
    res = gaudi_launch("--num_devices", "2", "--log-dir", str(logs), printer(tmp_path))
    assert res.returncode == 0, res.stderr
    assert victim.read_text() == "precious\n"
    assert os.path.islink(logs / "rank-0.log")
    assert res.stderr.count(f"cannot write {logs}/rank-0.log: it is a symbolic link (not followed)") == 1
    assert "[rank 0] rank 0 line 2 " in res.stdout  # still on the terminal
    assert (logs / "rank-1.log").read_text().splitlines()[2].startswith("rank 1 line 2 ")


# ---- item 6: a log that cannot be written ------------------------------------------------------------


def _limit_file_size():
    import resource

    resource.setrlimit(resource.RLIMIT_FSIZE, (16384, 16384))  # writes past 16 KiB fail with EFBIG


@pytest.mark.parametrize("code", [0, 3])
def test_failed_log_write_is_reported_once_and_output_and_exit_status_go_on(tmp_path, code):
    logs = tmp_path / "logs"
    res = gaudi_launch(
        "--num_devices",
        "1",
        "--log-dir",
        str(logs),
        printer(tmp_path, lines=3000, width=100, code=code),
        preexec_fn=_limit_file_size,
        timeout=120,
    )
    assert res.returncode == code, res.stderr[-2000:]
    out = [line for line in res.stdout.splitlines() if line.startswith("[rank 0] rank 0 line ")]
    assert len(out) == 3000 and out[-1].startswith("[rank 0] rank 0 line 2999 ")
    assert res.stderr.count("cannot write") == 1, res.stderr[-2000:]
    assert f"cannot write {logs}/rank-0.log: File too large; its output goes on to the terminal only" in res.stderr
    assert 0 < os.path.getsize(logs / "rank-0.log") <= 16384


def test_read_only_log_dir_is_reported_once_and_the_job_goes_on(tmp_path):
    if os.geteuid() != 0:
        if os.environ.get("CI") == "true":
            pytest.fail("needs root for a read-only bind mount")
        pytest.skip("needs root for a read-only bind mount")
    logs = tmp_path / "logs"
    logs.mkdir()
    # The launcher alone sees the directory read-only: a bind mount in its own mount namespace.
    ro = 'mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" && shift && exec "$@"'
    argv = [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "--",
        "sh",
        "-c",
        ro,
        "ro",
        str(logs),
        sys.executable,
        "-m",
        "gaudi_launch",
        "--num_devices",
        "2",
        "--log-dir",
        str(logs),
        printer(tmp_path),
    ]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    # (ranks that succeed: a failing rank 0 tears rank 1 down, under load before its first line)
    assert res.returncode == 0, res.stderr
    assert res.stderr.count("cannot write") == 2  # once per rank's log
    assert f"cannot write {logs}/rank-1.log: Read-only file system" in res.stderr
    assert "[rank 1] rank 1 line 2 " in res.stdout and os.listdir(logs) == []


# ---- item 15: output tails are bounded in bytes ------------------------------------------------------


def test_a_huge_line_is_shown_whole_but_kept_cut_in_the_summary(tmp_path):
    script = tmp_path / "huge.py"
    script.write_text("import sys\nprint('start')\nprint('y' * 3000000)\nsys.exit(7)\n")
    res = gaudi_launch("--num_devices", "1", str(script), timeout=120)
    assert res.returncode == 7
    assert sum(line.count("y") for line in res.stdout.splitlines()) == 3000000  # nothing lost on the terminal
    summary = res.stderr[res.stderr.index("gaudi-launch: job failed") :]
    cut = [line for line in summary.splitlines() if "yyy" in line]
    assert cut and all(len(line) < 2100 and re.search(r" \.\.\. \[\d+ more characters\]$", line) for line in cut)


def test_supervisor_tails_hold_at_most_200_cut_lines(tmp_path):
    import io

    from gaudi_launch.process.supervise import TAIL_KEEP, TAIL_LINE_CHARS, ProcSpec, Supervisor

    code = "for i in range(400): print(str(i) * 50000)"
    spec = ProcSpec(rank=0, host="localhost", argv=[sys.executable, "-c", code], env=dict(os.environ))
    result = Supervisor([spec], stdout=io.StringIO(), stderr=io.StringIO(), handle_signals=False).run()
    tail = result.procs[0].tail
    assert len(tail) == TAIL_KEEP and tail[-1].startswith("399399")
    assert max(len(line) for line in tail) <= TAIL_LINE_CHARS + 40


# ---- item 7: the job-id sweep reaches a rank's daemon (local backend) -----------------------------------

DAEMON_RANK = """\
import ctypes, os, signal, sys, time
pid_file, code, ignore_term, hide = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1", sys.argv[4] == "1"
if os.fork() == 0:                       # double fork + setsid: out of the rank's process group
    os.setsid()
    if os.fork() == 0:
        if ignore_term:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if hide:                         # not dumpable: its /proc environ is closed to its own user
            ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)
        with open(pid_file + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.replace(pid_file + ".tmp", pid_file)
        time.sleep(900)
    os._exit(0)
while not os.path.exists(pid_file):
    time.sleep(0.02)
print("daemon", open(pid_file).read(), flush=True)
sys.exit(code)
"""


def daemon_job(tmp_path, *, code=0, ignore_term=False, hide=False, extra=(), **kwargs):
    script = tmp_path / "daemon_rank.py"
    script.write_text(DAEMON_RANK)
    pid_file = tmp_path / "daemon.pid"
    res = gaudi_launch(
        "--num_devices",
        "1",
        "--grace",
        "1",
        *extra,
        str(script),
        str(pid_file),
        str(code),
        "1" if ignore_term else "0",
        "1" if hide else "0",
        cwd=str(tmp_path),
        **kwargs,
    )
    return res, int(pid_file.read_text())


@pytest.mark.parametrize("code", [0, 3])
def test_a_ranks_daemon_does_not_outlive_the_job(tmp_path, code):
    res, daemon = daemon_job(tmp_path, code=code)
    try:
        assert res.returncode == code, res.stderr
        assert not alive(daemon), "the rank's setsid daemon survived the job"
    finally:
        if alive(daemon):
            os.kill(daemon, 9)


def test_a_daemon_that_ignores_sigterm_gets_sigkill_after_the_grace_period(tmp_path):
    res, daemon = daemon_job(tmp_path, code=0, ignore_term=True)
    try:
        assert res.returncode == 0, res.stderr
        assert not alive(daemon)
    finally:
        if alive(daemon):
            os.kill(daemon, 9)


def test_a_daemon_goes_when_the_launcher_is_signalled(tmp_path):
    script = tmp_path / "daemon_rank.py"
    script.write_text(DAEMON_RANK.replace("sys.exit(code)", "time.sleep(900)"))
    pid_file = tmp_path / "daemon.pid"
    job = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gaudi_launch",
            "--num_devices",
            "1",
            "--grace",
            "1",
            str(script),
            str(pid_file),
            "0",
            "0",
            "0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    daemon = None
    try:
        assert wait_for(pid_file.exists, timeout=60)
        daemon = int(pid_file.read_text())
        job.send_signal(15)
        _, err = job.communicate(timeout=60)
        assert job.returncode == 128 + 15, err
        assert wait_for(lambda: not alive(daemon), timeout=10)
    finally:
        job.kill()
        if daemon and alive(daemon):
            os.kill(daemon, 9)


# ---- item 18: what the teardown cannot inspect is said, not counted as nothing ---------------------------


def unprivileged_python(workdir):
    """An interpreter uid 65534 can run, with this checkout and the venv's packages importable."""
    import site

    path = os.pathsep.join([ROOT, *site.getsitepackages()])
    env = {"PATH": "/usr/bin:/bin", "HOME": str(workdir), "PYTHONPATH": path}
    for python in (os.path.realpath(sys.executable), "/usr/bin/python3"):
        try:
            ok = (
                subprocess.run(
                    [python, "-c", "import gaudi_launch.cli, yaml, typer, paramiko"],
                    user=65534,
                    group=65534,
                    extra_groups=[],
                    env=env,
                    cwd=workdir,
                    capture_output=True,
                    timeout=60,
                ).returncode
                == 0
            )
        except OSError:
            ok = False
        if ok:
            return python, env
    reason = "no Python interpreter that uid 65534 can run with gaudi-launch's packages"
    if os.environ.get("CI") == "true":
        pytest.fail(reason)
    pytest.skip(reason)


def test_a_job_process_closed_to_inspection_is_reported_not_counted_as_nothing(request):
    if os.geteuid() != 0:
        if os.environ.get("CI") == "true":
            pytest.fail("needs root to run the job as another user")
        pytest.skip("needs root to run the job as another user")
    import shutil
    import tempfile

    tmp_path = __import__("pathlib").Path(tempfile.mkdtemp(prefix="gl-uid65534-"))  # pytest's is 0700
    os.chmod(tmp_path, 0o777)
    request.addfinalizer(lambda: shutil.rmtree(tmp_path, ignore_errors=True))
    python, env = unprivileged_python(tmp_path)
    script = tmp_path / "daemon_rank.py"
    script.write_text(DAEMON_RANK)
    pid_file = tmp_path / "daemon.pid"
    res = subprocess.run(
        [python, "-m", "gaudi_launch", "--num_devices", "1", "--grace", "1", str(script), str(pid_file), "0", "0", "1"],
        user=65534,
        group=65534,
        extra_groups=[],
        env=env,
        cwd=str(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    daemon = int(pid_file.read_text())
    try:
        assert res.returncode == 0, res.stderr
        assert alive(daemon)  # closed to its own user: the sweep cannot tell it is the job's
        assert (
            "gaudi-launch: on localhost, 1 process(es) that may belong to this job could not be inspected" in res.stderr
        ), res.stderr
        assert f"pid {daemon} (" in res.stderr and "uid 65534): its environment cannot be read" in res.stderr
    finally:
        if alive(daemon):
            os.kill(daemon, 9)


# ---- item 15: local planning is linear in ranks ------------------------------------------------------


def test_sixteen_thousand_local_ranks_are_planned_with_their_contract(tmp_path):
    res = gaudi_launch(
        "--num_devices", "16000", "--dry-run", "--json", marker_script(tmp_path), cwd=tmp_path, timeout=300
    )
    assert res.returncode == 0, res.stderr[-2000:]
    import json

    commands = json.loads(res.stdout)["commands"]
    assert len(commands) == 16000
    last = commands[-1]["env"]
    assert (last["RANK"], last["LOCAL_RANK"], last["WORLD_SIZE"], last["CROSS_SIZE"]) == (
        "15999",
        "15999",
        "16000",
        "1",
    )


def test_local_planning_computes_device_visibility_once_per_node(monkeypatch, tmp_path):
    from gaudi_launch.backends import get_backend, local
    from gaudi_launch.inputs.spec import JobSpec
    from gaudi_launch.plan.planner import build_plan

    calls = []
    real = local.node_visibility_env
    monkeypatch.setattr(local, "node_visibility_env", lambda node, env: calls.append(node.host) or real(node, env))
    (tmp_path / "hosts").write_text("localhost slots=4000\n")
    plan = build_plan(
        JobSpec(
            program=["train.py"],
            hostfile=str(tmp_path / "hosts"),
            include="localhost:1-3999".replace("1-3999", ",".join(map(str, range(1, 4000)))),
        ),
        environ={},
        backends=get_backend,
    )
    assert len(plan.commands) == 3999 and calls == ["localhost"]
    assert plan.commands[-1].env["CUDA_VISIBLE_DEVICES"].split(",")[-1] == "3999"


# ---- item 8: whose host-key policy the job's ssh follows (the plan; tests/cluster/test_security.py runs it) --


@pytest.mark.parametrize(
    "config_line, extra, policy, noted",
    [
        ("", [], "StrictHostKeyChecking=accept-new", True),
        ("    StrictHostKeyChecking yes\n", [], None, False),
        ("    StrictHostKeyChecking accept-new\n", ["--strict-host-keys"], "StrictHostKeyChecking=yes", False),
    ],
)
def test_the_users_ssh_config_decides_host_keys(tmp_path, config_line, extra, policy, noted):
    import json

    (tmp_path / "hosts").write_text("node-a slots=1\nnode-b slots=1\n")
    (tmp_path / "ssh_config").write_text("Host node-*\n    ForwardAgent yes\n" + config_line)
    res = gaudi_launch(
        "--hostfile",
        "hosts",
        "--ssh-config",
        "ssh_config",
        "--no-ssh-check",
        "--backend",
        "mpirun",
        *extra,
        "--dry-run",
        "--json",
        marker_script(tmp_path),
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr
    plan = json.loads(res.stdout)
    keys = [a for a in plan["ssh_args"] if a.startswith("StrictHostKeyChecking=")]
    assert keys == ([policy] if policy else [])
    assert "ForwardAgent=no" in plan["ssh_args"]
    assert any(n.startswith("host keys: ssh accepts") for n in plan["notes"]) == noted


def test_error_records_kept_per_process_are_bounded():
    import io
    import json

    from gaudi_launch.process.supervise import RECORDS_KEEP, ProcSpec, Supervisor
    from gaudi_launch.wire import ERROR_MARKER

    record = json.dumps({"rank": 0, "exit_code": 1, "traceback": "x" * 10000})
    code = f"import sys\nfor i in range(3000): print({ERROR_MARKER + record!r})\nsys.exit(1)"
    spec = ProcSpec(rank=0, host="localhost", argv=[sys.executable, "-c", code], env=dict(os.environ))
    result = Supervisor([spec], stdout=io.StringIO(), stderr=io.StringIO(), handle_signals=False).run()
    assert result.exit_code == 1 and len(result.procs[0].records) == RECORDS_KEEP
    assert result.culprit.rank == 0


def test_host_key_policy_in_an_included_ssh_config_file_counts(tmp_path):
    import json

    (tmp_path / "hosts").write_text("node-a slots=1\nnode-b slots=1\n")
    (tmp_path / "conf.d").mkdir()
    (tmp_path / "conf.d" / "50-cluster.conf").write_text("Host node-*\n    StrictHostKeyChecking yes\n")
    (tmp_path / "ssh_config").write_text(f"Include {tmp_path}/conf.d/*.conf\nHost *\n    SendEnv LANG\n")
    res = gaudi_launch(
        "--hostfile",
        "hosts",
        "--ssh-config",
        "ssh_config",
        "--no-ssh-check",
        "--backend",
        "mpirun",
        "--dry-run",
        "--json",
        marker_script(tmp_path),
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr
    assert not [a for a in json.loads(res.stdout)["ssh_args"] if a.startswith("StrictHostKeyChecking=")]
