"""Issue 12 (items 1, 4, 13, 19), the pure and file-level parts: the per-job directory and job file,
the DeepSpeed runner's scrubbed environment and validated values, masking of exported secrets."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from gaudi_launch.backends import deepspeed
from gaudi_launch.errors import UserError
from gaudi_launch.inputs.spec import JobSpec
from gaudi_launch.plan.launchplan import LaunchPlan, NodePlan
from gaudi_launch.remote import jobdir


def plan_of(**kw) -> LaunchPlan:
    nodes = [NodePlan("gl-n0", 0, [0, 1], [0, 1]), NodePlan("gl-n1", 1, [0, 1], [2, 3])]
    base = dict(
        backend="deepspeed",
        world_size=4,
        master_addr="gl-n0",
        master_port=29600,
        nodes=nodes,
        env={},
        commands=[],
        program=["t.py"],
        job_id="0123abcd",
    )
    base.update(kw)
    return LaunchPlan(**base)


def test_job_dir_is_created_fresh_and_private(tmp_path):
    path = str(tmp_path / "gaudi-launch-0123abcd")
    old = os.umask(0)
    try:
        jobdir.create(path)
    finally:
        os.umask(old)
    assert os.stat(path).st_mode & 0o777 == 0o700
    assert open(os.path.join(path, "owner")).read().split()[1] == str(os.getpid())
    with pytest.raises(FileExistsError):  # never reused, whoever made it
        jobdir.create(path)


def test_an_existing_job_dir_is_refused_by_the_deepspeed_backend(tmp_path):
    path = str(tmp_path / "gaudi-launch-0123abcd")
    os.mkdir(path, 0o700)
    with pytest.raises(UserError) as info:
        deepspeed.write_job_dir(plan_of(), path, b"{}")
    assert "never reused" in info.value.message


def test_a_dir_of_another_mode_or_a_link_is_not_private(tmp_path):
    open_dir = tmp_path / "open"
    open_dir.mkdir(mode=0o755)
    os.chmod(open_dir, 0o755)
    with pytest.raises(jobdir.JobDirError):
        jobdir.check_private_dir(str(open_dir))
    link = tmp_path / "link"
    link.symlink_to(tmp_path)
    with pytest.raises(jobdir.JobDirError):
        jobdir.check_private_dir(str(link))


def test_is_stale_decisions():
    host = "me"
    dead_owner = "me 999999999 1"  # no such pid
    assert jobdir.is_stale(dead_owner, "aa", 500, set(), host)
    assert not jobdir.is_stale(dead_owner, "aa", 500, {"aa"}, host)  # a process still carries the id
    assert not jobdir.is_stale(dead_owner, "aa", 5, set(), host)  # too young: ranks may be starting
    assert not jobdir.is_stale("other 999999999 1", "aa", 500, set(), host)  # another host's launcher
    assert not jobdir.is_stale(jobdir.owner_record(), "aa", 500, set(), jobdir.owner_record().split()[0])
    assert jobdir.is_stale(None, "aa", 500, set(), host)  # made by ranks, none left


def test_clean_stale_removes_only_dead_jobs_of_ours(tmp_path):
    dead = tmp_path / "gaudi-launch-00000001"
    jobdir.create(str(dead))
    (dead / "owner").unlink()
    jobdir.write_private(str(dead / "owner"), f"{jobdir.owner_record().split()[0]} 999999999 1\n".encode())
    mine = tmp_path / "gaudi-launch-00000002"
    jobdir.create(str(mine))  # this live process's
    other = tmp_path / "gaudi-launch-00000003"
    other.mkdir(mode=0o755)  # not private: not ours to judge
    os.chmod(other, 0o755)
    unrelated = tmp_path / "gaudi-launch-notajob"
    unrelated.mkdir(mode=0o700)
    rank_dir = tmp_path / "gaudi-launch-00000004-rank3-ab_c9"  # a SIGKILLed rank's error-file dir
    rank_dir.mkdir(mode=0o700)
    ranks_job_dir = tmp_path / "gaudi-launch-00000005-5eed5eed5eed5eed"  # ranks' own, with the job's suffix
    ranks_job_dir.mkdir(mode=0o700)
    later = time.time() + 3600
    assert sorted(jobdir.clean_stale(str(tmp_path), now=later)) == [str(dead), str(rank_dir), str(ranks_job_dir)]
    assert mine.exists() and other.exists() and unrelated.exists()


def test_clean_stale_reads_the_processes_environments_only_for_a_directory_old_enough(tmp_path, monkeypatch):
    """Every rank 0 cleans at its start: with only young directories nothing can be stale, so the scan of every
    process's environment (live_job_ids) is not paid; an old one still gets it, once (issue 34: per-host CPU)."""
    scans = []
    monkeypatch.setattr(jobdir, "live_job_ids", lambda: scans.append(1) or {"00000007"})
    for job in ("00000006", "00000007"):
        (tmp_path / f"gaudi-launch-{job}").mkdir(mode=0o700)
    now = time.time()
    assert jobdir.clean_stale(str(tmp_path), now=now) == [] and scans == []
    later = now + 3600
    assert jobdir.clean_stale(str(tmp_path), now=later) == [str(tmp_path / "gaudi-launch-00000006")]
    assert scans == [1] and (tmp_path / "gaudi-launch-00000007").exists()


def test_receive_accepts_the_same_file_on_a_shared_filesystem_and_refuses_another(tmp_path):
    path = str(tmp_path / "gaudi-launch-0123abcd")
    data = b'{"env": {}}'
    jobdir.receive(path, jobdir.digest(data), data)
    assert os.stat(os.path.join(path, "job.json")).st_mode & 0o777 == 0o600
    jobdir.receive(path, jobdir.digest(data), data)  # already there (same file): fine
    with pytest.raises(jobdir.JobDirError):
        jobdir.receive(path, jobdir.digest(b"{}"), b"{}")
    with pytest.raises(jobdir.JobDirError):
        jobdir.receive(path, jobdir.digest(b"{}"), b"{ }")  # damaged in transit


def test_receive_over_stdin_as_ssh_runs_it(tmp_path):
    path = str(tmp_path / "gaudi-launch-0123abcd")
    data = b'{"secret": "s3cr3t"}'
    res = subprocess.run(
        [sys.executable, "-m", "gaudi_launch.remote.jobdir", "receive", path, jobdir.digest(data)],
        input=data,
        capture_output=True,
    )
    assert res.returncode == 0, res.stderr
    assert open(os.path.join(path, "job.json"), "rb").read() == data
    res = subprocess.run([sys.executable, "-m", "gaudi_launch.remote.jobdir", "remove", path], capture_output=True)
    assert res.returncode == 0 and not os.path.exists(path)


@pytest.mark.parametrize("addr", ["x;id", "$(id)", "a b", "-oProxyCommand=x", "h`id`", ""])
def test_master_addr_is_validated_for_deepspeed(addr, tmp_path):
    with pytest.raises(UserError) as info:
        deepspeed.build_argv(plan_of(master_addr=addr), JobSpec(program=["t.py"]), {}, str(tmp_path))
    assert info.value.where == "--master_addr"


@pytest.mark.parametrize("addr", ["gl-n0", "10.0.0.1", "fe80::1%eth0", "node_1.cluster.local", "::1"])
def test_plain_master_addresses_pass(addr, tmp_path):
    argv = deepspeed.build_argv(plan_of(master_addr=addr), JobSpec(program=["t.py"]), {}, str(tmp_path))
    assert argv[argv.index("--master_addr") + 1] == addr


def test_a_job_dir_path_a_shell_would_split_is_refused():
    with pytest.raises(UserError) as info:
        deepspeed.build_argv(plan_of(), JobSpec(program=["t.py"]), {}, "/tmp/a b;c/gaudi-launch-0123abcd")
    assert info.value.where == "TMPDIR"


def test_an_interpreter_path_a_shell_would_split_is_refused(tmp_path):
    with pytest.raises(UserError) as info:
        deepspeed.build_argv(plan_of(), JobSpec(program=["t.py"], python="/opt/my env/bin/python"), {}, str(tmp_path))
    assert info.value.where == "--python"


def test_runner_environment_is_scrubbed():
    environ = {
        "PATH": "/bin",
        "HOME": "/root",
        "PYTHONPATH": "$(touch x)",
        "MLFLOW_TRACKING_TOKEN": "tok",
        "UCX_TLS": "x",
        "MV2_X": "y",
        "NCCL_DEBUG": "INFO",
        "HF_TOKEN": "hf",
        "SSH_AUTH_SOCK": "/s",
        "OMPI_MCA_btl": "tcp,self",
    }
    env = deepspeed.runner_env(environ, {"DS_ENV_FILE": "/j/job.env"})
    assert env == {
        "PATH": "/bin",
        "HOME": "/root",
        "SSH_AUTH_SOCK": "/s",
        "OMPI_MCA_btl": "tcp,self",
        "DS_ENV_FILE": "/j/job.env",
    }
    assert not any(k.startswith(("PYTHON", "MLFLOW", "MV2", "UCX", "NCCL")) for k in deepspeed.RUNNER_ENV)


def test_exported_secrets_are_masked_and_never_shown(monkeypatch):
    from gaudi_launch.plan.shared import export_settings

    plan = plan_of()
    environ = {"MYAPP_API_TOKEN": "tok-1234567", "MYAPP_MODE": "fast", "PATH": "/bin"}
    export_settings(plan, JobSpec(program=["t.py"], export_prefixes=["MYAPP_"], efa=False), environ)
    assert "MYAPP_API_TOKEN" in plan.exported
    assert plan.mask("got tok-1234567") == "got ***"
    shown = plan.to_json() + plan.render_text()
    assert "tok-1234567" not in shown and plan.job_key not in shown


def test_ds_runner_never_installs_deepspeeds_handler():
    code = (
        "import signal, types, sys\n"
        "from gaudi_launch.backends import ds_runner\n"
        "s = ds_runner._without_handlers(signal)\n"
        "s.signal(signal.SIGTERM, lambda *a: print('pkill'))\n"
        "assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL\n"
        "assert s.SIGTERM == signal.SIGTERM\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def test_the_launchers_directory_replaces_the_job_dir_on_pythonpath():
    from gaudi_launch.process.worker import cwd_on_path

    ds = {"PYTHONPATH": "/tmp/gaudi-launch-0123abcd"}  # what DeepSpeed's runner exported
    assert cwd_on_path({}, ds, "/tmp/gaudi-launch-0123abcd", "/work") == {"PYTHONPATH": "/work"}
    assert cwd_on_path({"PYTHONPATH": "/mine"}, ds, "/tmp/gaudi-launch-0123abcd", "/work") == {
        "PYTHONPATH": "/work:/mine"
    }
    assert cwd_on_path({"A": "1"}, {"PYTHONPATH": "/x"}, "/tmp/gaudi-launch-0123abcd", "/work") == {"A": "1"}


def test_a_worker_given_another_job_file_refuses_to_start(tmp_path):
    os.chmod(tmp_path, 0o700)
    data = jobdir.payload({}, ["t.py"], False, str(tmp_path), "k")
    jobdir.write_private(str(tmp_path / "job.json"), data)
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "gaudi_launch.process.worker",
            f"--job-file={tmp_path}/job.json",
            "--job-sha256=" + "0" * 64,
        ],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 2
    assert "cannot start from the job file" in res.stderr and "digest" in res.stderr
    assert "Traceback" not in res.stderr


def test_the_workers_job_dir_is_made_private_and_an_open_one_refused(tmp_path, monkeypatch):
    import tempfile

    from gaudi_launch.wire import private_rank_dir

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    path = private_rank_dir("0123abcd", {})
    assert os.stat(path).st_mode & 0o777 == 0o700
    assert private_rank_dir("0123abcd", {}) == path  # the job's other ranks share it
    planted = tmp_path / "gaudi-launch-0000feed"
    planted.mkdir(mode=0o777)
    os.chmod(planted, 0o777)
    with pytest.raises(jobdir.JobDirError, match="mode 777"):  # the rank then fails (issue 36 item 4)
        private_rank_dir("0000feed", {})


@pytest.mark.parametrize("backend", ["mpirun", "deepspeed", "local"])
def test_each_plan_draws_the_suffix_of_its_ranks_job_directories_and_no_argv_shows_it(backend, tmp_path, monkeypatch):
    """Issue 36 item 4: the name a rank makes its job directory under is not the public job id alone."""
    import contextlib
    import io
    import json

    from gaudi_launch.cli import main
    from gaudi_launch.wire import JOB_DIR_SUFFIX, path_for

    monkeypatch.chdir(tmp_path)
    (tmp_path / "hosts").write_text("gaudi-a slots=2\ngaudi-b slots=2\n")
    hosts = [] if backend == "local" else ["--hostfile", "hosts", "--no-ssh-check"]
    plans = []
    for _ in range(2):
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            assert main(["--dry-run", "--json", "--backend", backend, *hosts, "--no-efa", "train.py"]) == 0
        plans.append(json.loads(out.getvalue()))
    suffixes = [p["env"][JOB_DIR_SUFFIX] for p in plans]
    assert all(len(s) == 16 and int(s, 16) >= 0 for s in suffixes) and suffixes[0] != suffixes[1]
    for plan, suffix in zip(plans, suffixes):
        shown = [arg for cmd in plan["commands"] for arg in cmd["argv"] if suffix in arg]  # `ps` shows argv
        # DeepSpeed's runner names its job file (made before the runner starts): the one place, there
        made = path_for(plan["job_id"], suffix=suffix)
        assert all(arg.startswith((made, f"--job-file={made}/")) for arg in shown) and (backend == "deepspeed") == bool(
            shown
        )
        assert path_for(plan["job_id"], "/t", suffix) == f"/t/gaudi-launch-{plan['job_id']}-{suffix}"
    assert path_for("0badc0de", "/t", "../x") == "/t/gaudi-launch-0badc0de"  # not hex: not a name part
