"""Issue 36: what another user of a shared working directory, log or output directory, or /tmp can still
do, on the CLI as a process. "Another user" is a second local account (tests/other_user.py) owning the
files they plant, as the review did."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest

from tests.other_user import NAME as OTHER_NAME
from tests.other_user import other_uid


def gaudi_launch(*args, cwd=None, env=None, timeout=60):
    return subprocess.run(
        [sys.executable, "-m", "gaudi_launch", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env=env,
    )


@pytest.fixture
def shared(tmp_path):
    """A working directory a team shares (1777, as /tmp), a HOME of our own, and a script that says it ran."""
    work, home = tmp_path / "team", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    os.chmod(work, 0o1777)
    (work / "train.py").write_text(
        "import os\nprint('ran', os.environ.get('FROM_FILE'), os.environ.get('PYTHONPATH', ''), flush=True)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "DS_ENV_FILE"}
    env.update(HOME=str(home), HABANA_VISIBLE_MODULES="0")
    return work, home, env


def plant(path, text: str, uid: int, mode: int = 0o644) -> None:
    path.write_text(text)
    os.chown(path, uid, uid)
    os.chmod(path, mode)


# ---- item 1: an env file someone else can write is not read ----------------------------------------


def test_a_deepspeed_env_of_another_user_in_the_working_directory_is_refused(shared):
    work, _, env = shared
    evil = work / "evil"
    evil.mkdir()
    (evil / "sitecustomize.py").write_text("open('PWNED', 'w').close()\n")
    plant(work / ".deepspeed_env", f"PYTHONPATH={evil}\nFROM_FILE=x\n", other_uid())
    res = gaudi_launch("--num_devices", "1", "train.py", cwd=work, env=env)
    assert res.returncode == 2, res.stdout + res.stderr
    assert f"{work / '.deepspeed_env'}: the env file belongs to user {OTHER_NAME}" in res.stderr
    assert "ran" not in res.stdout and not (work / "PWNED").exists()


def test_ds_env_file_of_another_user_is_refused(shared, tmp_path):
    work, _, env = shared
    other = tmp_path / "other.env"
    plant(other, "FROM_FILE=x\n", other_uid())
    res = gaudi_launch("--num_devices", "1", "train.py", cwd=work, env={**env, "DS_ENV_FILE": str(other)})
    assert res.returncode == 2 and f"{other}: the env file belongs to user {OTHER_NAME}" in res.stderr, res.stderr


def test_a_group_writable_deepspeed_env_of_ours_is_refused(shared):
    work, _, env = shared
    plant(work / ".deepspeed_env", "FROM_FILE=x\n", os.geteuid(), mode=0o664)
    res = gaudi_launch("--num_devices", "1", "train.py", cwd=work, env=env)
    assert res.returncode == 2 and "the env file is writable by its group (mode 664)" in res.stderr, res.stderr


def test_a_loader_variable_in_a_found_file_is_refused_but_a_named_file_may_set_it(shared):
    work, home, env = shared
    plant(home / ".deepspeed_env", "FROM_FILE=x\nexport PYTHONPATH=/opt/mine\n", os.geteuid())
    res = gaudi_launch("--num_devices", "1", "train.py", cwd=work, env=env)
    assert res.returncode == 2, res.stdout + res.stderr
    assert f"{home / '.deepspeed_env'}:2: PYTHONPATH in an env file that was found, not named" in res.stderr
    named = gaudi_launch(
        "--num_devices", "1", "--env-file", str(home / ".deepspeed_env"), "train.py", cwd=work, env=env
    )
    assert named.returncode == 0, named.stderr
    assert "ran x /opt/mine" in named.stdout


def test_every_run_says_which_env_files_were_read(shared):
    work, home, env = shared
    plant(home / ".deepspeed_env", "FROM_FILE=home\n", os.geteuid(), mode=0o600)
    res = gaudi_launch("--num_devices", "1", "train.py", cwd=work, env=env)
    assert res.returncode == 0, res.stderr
    assert "ran home" in res.stdout
    assert f"gaudi-launch: environment files read: {home / '.deepspeed_env'}" in res.stderr


def test_a_named_env_file_of_another_user_is_read_as_asked(shared, tmp_path):
    work, _, env = shared
    other = tmp_path / "team.env"
    plant(other, "FROM_FILE=team\n", other_uid())
    res = gaudi_launch("--num_devices", "1", "--env-file", str(other), "train.py", cwd=work, env=env)
    assert res.returncode == 0 and "ran team" in res.stdout, res.stderr


# ---- item 3: --log-dir is opened once, never through another user's link --------------------------------


@pytest.fixture
def root_logs(tmp_path):
    """A private directory of ours holding a rank-0.log that must survive (root's logs, as in the review)."""
    victim = tmp_path / "private-logs"
    victim.mkdir(mode=0o700)
    (victim / "rank-0.log").write_text("precious\n")
    return victim


def test_a_log_dir_that_is_a_link_is_refused_and_its_target_untouched(shared, root_logs):
    work, _, env = shared
    link = work / "logs"
    link.symlink_to(root_logs)
    os.lchown(link, other_uid(), other_uid())
    res = gaudi_launch("--num_devices", "1", "--log-dir", str(link), "train.py", cwd=work, env=env)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "the log directory is a symbolic link (not followed)" in res.stderr
    assert (root_logs / "rank-0.log").read_text() == "precious\n" and "ran" not in res.stdout


def test_another_users_link_on_the_way_to_the_log_dir_is_refused(shared, root_logs):
    work, _, env = shared
    link = work / "team"
    link.symlink_to(root_logs.parent)
    os.lchown(link, other_uid(), other_uid())
    res = gaudi_launch("--num_devices", "1", "--log-dir", str(link / root_logs.name), "train.py", cwd=work, env=env)
    assert res.returncode == 2, res.stdout + res.stderr
    assert f"the log directory's path goes through a link of uid {other_uid()}" in res.stderr
    assert (root_logs / "rank-0.log").read_text() == "precious\n"


def test_a_link_of_our_own_on_the_way_is_followed(shared, tmp_path):
    work, home, env = shared
    (tmp_path / "real").mkdir()
    (home / "runs").symlink_to(tmp_path / "real")
    res = gaudi_launch("--num_devices", "1", "--log-dir", str(home / "runs" / "logs"), "train.py", cwd=work, env=env)
    assert res.returncode == 0, res.stderr
    assert "ran" in (tmp_path / "real" / "logs" / "rank-0.log").read_text()


# ---- item 6: a YAML alias bomb in a job file --------------------------------------------------------------


def alias_bomb(levels: int = 9, width: int = 9) -> str:
    """The review's shape: env's items each a list of the one before (9**9 strings when expanded)."""
    lines = ['  - &a0 ["lol"]']
    lines += [f"  - &a{i} [{', '.join([f'*a{i - 1}'] * width)}]" for i in range(1, levels)]
    return "\n".join(["num_devices: 1", "env:", *lines]) + "\n"


def test_a_yaml_alias_bomb_is_refused_at_once_naming_the_line(tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text(alias_bomb())
    assert len(job.read_bytes()) < 1000
    res = gaudi_launch("--config", str(job), "train.py", cwd=tmp_path, timeout=20)
    assert res.returncode == 2, res.stderr
    assert f"{job}:4: YAML aliases of a list or mapping (*a0) are not allowed in a job file" in res.stderr


@pytest.mark.parametrize(
    "text, line",
    [("num_devices: 1\nenv:\n  A: [1, 2]\n", 3), ("env:\n  - A=1\n  - {B: 2}\n", 3), ("env: {A: {B: 1}}\n", 1)],
)
def test_env_values_in_a_job_file_are_text(tmp_path, text, line):
    job = tmp_path / "job.yaml"
    job.write_text(text)
    res = gaudi_launch("--config", str(job), "train.py", cwd=tmp_path)
    assert res.returncode == 2 and f"{job}:{line}: --env takes text, not a nested list or mapping" in res.stderr, (
        res.stderr
    )


# ---- item 7: a FIFO, a device or deep nesting as an input file is exit 2 naming it, never a hang ------------


@pytest.fixture
def fifo(tmp_path):
    path = tmp_path / "pipe"
    os.mkfifo(path)
    return str(path)


@pytest.mark.parametrize(
    "args, said",
    [
        (["--hostfile", "{f}", "train.py"], "{f}: hostfile cannot be read: is a FIFO (named pipe), not a regular file"),
        (["--config", "{f}", "train.py"], "{f}: cannot read config file: is a FIFO (named pipe), not a regular file"),
        (["--exclude-from", "{f}", "train.py"], "--exclude-from: file {f} cannot be read: is a FIFO (named pipe)"),
        (["--ssh-config", "{f}", "train.py"], "--ssh-config: ssh config file {f} cannot be read: is a FIFO"),
        (["--env-file", "{f}", "train.py"], "--env-file: env file {f} is not a regular file"),
        (["--ssh-config", "/dev/zero", "train.py"], "ssh config file /dev/zero cannot be read: is a character device"),
        (["--exclude-from", "/dev/zero", "train.py"], "file /dev/zero cannot be read: is a character device"),
        (["{f}"], "SCRIPT: {f} is a FIFO (named pipe), not a script file"),
    ],
)
def test_a_fifo_or_a_device_as_an_input_is_exit_2_at_once(shared, fifo, args, said):
    work, _, env = shared
    res = gaudi_launch("--num_devices", "1", *(a.format(f=fifo) for a in args), cwd=work, env=env, timeout=20)
    assert res.returncode == 2, res.stdout + res.stderr
    assert said.format(f=fifo) in res.stderr and "Traceback" not in res.stderr


def test_report_of_a_fifo_is_exit_2_at_once(shared, fifo):
    work, _, env = shared
    os.rename(fifo, work / "metrics.jsonl")
    res = gaudi_launch("report", str(work / "metrics.jsonl"), cwd=work, env=env, timeout=20)
    assert res.returncode == 2 and "is a FIFO (named pipe), not a regular file" in res.stderr, res.stderr


def test_deep_json_in_exclude_from_and_huge_numbers_in_a_job_file_are_exit_2(shared):
    work, _, env = shared
    (work / "deep.json").write_text("[" * 100000 + "]" * 100000)
    res = gaudi_launch("--num_devices", "1", "--exclude-from", "deep.json", "train.py", cwd=work, env=env)
    assert res.returncode == 2 and "--exclude-from: cannot read deep.json" in res.stderr, res.stderr
    for key in ("grace", "ssh_timeout", "hang_timeout", "start_timeout", "min_bandwidth"):
        (work / "job.yaml").write_text(f"{key}: {9 * 10**400}\n")
        res = gaudi_launch("--config", "job.yaml", "--dry-run", "train.py", cwd=work, env=env)
        assert res.returncode == 2 and "job.yaml:1:" in res.stderr and "too large a number" in res.stderr, res.stderr
    (work / "job.yaml").write_text("env: " + "[" * 5000 + "]" * 5000 + "\n")
    res = gaudi_launch("--config", "job.yaml", "--dry-run", "train.py", cwd=work, env=env)
    assert res.returncode == 2 and "job.yaml:1: nested deeper than 16 levels" in res.stderr, res.stderr


# ---- item 9: --grace is capped where each rank's watchdog caps it ----------------------------------------


def test_a_grace_the_ranks_watchdog_would_not_take_is_refused(shared):
    work, _, env = shared
    res = gaudi_launch("--num_devices", "1", "--grace", "3600", "train.py", cwd=work, env=env)
    assert res.returncode == 2 and "--grace: at most 3599 seconds, got 3600" in res.stderr, res.stderr
    assert "ran" not in res.stdout


# ---- item 8: masking gaps ---------------------------------------------------------------------------------

SECRET = "hfSEKRETvalue0123456789"


@pytest.mark.parametrize("offset", [5, 11, 17])
def test_a_secret_cut_by_the_one_mib_line_split_is_masked_whole(shared, offset):
    work, _, env = shared
    (work / "long.py").write_text(
        "import os, sys\n"
        f"line = 'a' * ((1 << 20) - {offset}) + os.environ['HF_TOKEN'] + 'b' * 300000\n"
        "sys.stdout.write(line + '\\n')\nsys.stdout.flush()\n"
    )
    res = gaudi_launch("--num_devices", "1", "long.py", cwd=work, env={**env, "HF_TOKEN": SECRET}, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.count("***") == 1, [p for p in res.stdout.split("a" * 50) if "***" in p or "SEKRET" in p]
    assert "SEK" not in res.stdout and "6789" not in res.stdout  # neither half of the cut secret in clear


def test_gaudi_launch_env_masks_hccl_and_pt_hpu_secrets(shared):
    work, _, env = shared
    res = gaudi_launch(
        "env", cwd=work, env={**env, "HCCL_SOCKET_TOKEN": "hccl-tok-98765", "PT_HPU_LAZY_DB_PASSWORD": "pw-24680"}
    )
    assert res.returncode in (0, 1), res.stderr
    out = res.stdout + res.stderr
    assert "HCCL_SOCKET_TOKEN" in out and "hccl-tok-98765" not in out and "pw-24680" not in out


# ---- item 4: a job directory another user made first ------------------------------------------------------

RANK_ENV = "import os, sys; from gaudi_launch.process import cardside; print(cardside.hpu_env([], dict(os.environ)))"


def test_a_rank_whose_job_directory_another_user_made_fails_naming_them(tmp_path):
    squatted = tmp_path / "gaudi-launch-0badc0de"
    squatted.mkdir(mode=0o777)
    os.chown(squatted, other_uid(), other_uid())
    env = {**os.environ, "TMPDIR": str(tmp_path), "GAUDI_LAUNCH_JOB_ID": "0badc0de", "RANK": "0"}
    res = subprocess.run([sys.executable, "-c", RANK_ENV], capture_output=True, text=True, env=env, timeout=60)
    assert res.returncode == 2, res.stdout + res.stderr
    assert f"{squatted} is not this user's alone (made by user {OTHER_NAME}" in res.stderr
    assert "will not run without its autocast op lists" in res.stderr


SUFFIX = "5eed5eed5eed5eed"  # what the launcher draws for each job (GAUDI_LAUNCH_JOB_DIR_SUFFIX) and no one else sees


def test_a_rank_with_the_jobs_suffix_is_not_stopped_by_a_directory_named_after_the_public_id(tmp_path):
    """The job id is shown first (the ssh control directory, srun's argv): the name a rank makes its job directory
    under carries the launcher's random suffix too, so another user who made gaudi-launch-<id> first stops nothing."""
    squatted = tmp_path / "gaudi-launch-0badc0de"
    squatted.mkdir(mode=0o777)
    os.chown(squatted, other_uid(), other_uid())
    env = {**os.environ, "TMPDIR": str(tmp_path), "GAUDI_LAUNCH_JOB_ID": "0badc0de", "RANK": "0"}
    env["GAUDI_LAUNCH_JOB_DIR_SUFFIX"] = SUFFIX
    res = subprocess.run([sys.executable, "-c", RANK_ENV], capture_output=True, text=True, env=env, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    own = os.lstat(tmp_path / f"gaudi-launch-0badc0de-{SUFFIX}")
    assert own.st_uid == os.geteuid() and stat.S_IMODE(own.st_mode) == 0o700


def test_a_rank_whose_suffixed_job_directory_another_user_made_fails_naming_them(tmp_path):
    squatted = tmp_path / f"gaudi-launch-0badc0de-{SUFFIX}"
    squatted.mkdir(mode=0o777)
    os.chown(squatted, other_uid(), other_uid())
    env = {**os.environ, "TMPDIR": str(tmp_path), "GAUDI_LAUNCH_JOB_ID": "0badc0de", "RANK": "0"}
    env["GAUDI_LAUNCH_JOB_DIR_SUFFIX"] = SUFFIX
    res = subprocess.run([sys.executable, "-c", RANK_ENV], capture_output=True, text=True, env=env, timeout=60)
    assert res.returncode == 2, res.stdout + res.stderr
    assert f"{squatted} is not this user's alone (made by user {OTHER_NAME}" in res.stderr


def test_a_launcher_job_directory_made_first_by_another_user_names_them(tmp_path):
    from gaudi_launch.remote import jobdir

    squatted = tmp_path / "gaudi-launch-0badc0de"
    squatted.mkdir()
    os.chown(squatted, other_uid(), other_uid())
    assert jobdir.owner_of(str(squatted)) == f"made by user {OTHER_NAME} (uid {other_uid()})"


def test_the_job_directory_is_made_before_the_ssh_directory_shows_the_id(tmp_path, monkeypatch):
    import tempfile

    from gaudi_launch.remote import jobdir, sshmux

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    conn = sshmux.Connections("0badc0de", [], str(tmp_path))
    try:
        assert os.path.basename(conn.dir) == "gaudi-launch-0badc0de-ssh"  # what another user of /tmp sees
        job_dir = tmp_path / "gaudi-launch-0badc0de"
        assert job_dir.is_dir() and os.stat(job_dir).st_uid == os.geteuid()  # theirs can no longer be made
        squat = subprocess.run(
            ["mkdir", str(job_dir)], user=other_uid(), group=other_uid(), extra_groups=[], capture_output=True
        )
        assert squat.returncode != 0
        jobdir.create(str(job_dir))  # the backend takes the directory this launcher reserved
        jobdir.write_private(str(job_dir / "hostfile"), b"localhost slots=1\n")
    finally:
        conn.close()
    assert job_dir.is_dir()  # a backend took it: it removes it at the job's end, not the connections


def test_a_reserved_job_directory_no_backend_used_goes_with_the_connections(tmp_path, monkeypatch):
    import tempfile

    from gaudi_launch.remote import sshmux

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    sshmux.Connections("0badc0df", [], str(tmp_path)).close()
    assert not (tmp_path / "gaudi-launch-0badc0df").exists()


def test_a_remote_sweep_with_a_hanging_python_is_bounded_and_leaves_nothing(tmp_path):
    """The review's broken --python hung the sweep 46 s and left its processes: the remote command line is
    run here by a shell as sshd runs it (`$SHELL -c LINE`), with a python that starts a child and hangs."""
    import time

    from gaudi_launch.remote.teardown import remote_argv
    from tests.helpers import alive, wait_for

    python = tmp_path / "broken-python"
    python.write_text(f"#!/bin/sh\nsleep 300 &\necho $! > {tmp_path}/child.pid\nexec sleep 300\n")
    python.chmod(0o755)
    line = remote_argv("host", [], str(python), "0badc0de", 15, limit=2)[-1]
    start = time.monotonic()
    done = subprocess.run(["/bin/sh", "-c", line], capture_output=True, timeout=60)
    assert time.monotonic() - start < 6, "the sweep was not bounded"
    assert done.returncode in (124, 137), done
    child = int((tmp_path / "child.pid").read_text())
    assert wait_for(lambda: not alive(child), timeout=5), "what the broken python started still runs"


LAUNCHER = """
import sys, time
from gaudi_launch.remote import jobdir
jobdir.create(sys.argv[1])
jobdir.remove_when_gone(sys.argv[1], sys.argv[2])
jobdir.write_private(sys.argv[1] + "/job.json", b"{}")
print("ready", flush=True)
time.sleep(300)
"""


def test_the_launcher_hosts_job_directory_goes_after_a_sigkill_with_no_rank_there(tmp_path):
    import signal

    from tests.helpers import wait_for

    path = tmp_path / "gaudi-launch-5ca1ab1e"
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, str(path), "5ca1ab1e"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert launcher.stdout.readline().strip() == "ready"
        assert (path / "job.json").exists()
        launcher.send_signal(signal.SIGKILL)
        launcher.wait(timeout=10)
        assert wait_for(lambda: not path.exists(), timeout=15), "the job directory stayed after the SIGKILL"
    finally:
        launcher.kill()


def test_a_finished_jobs_watch_ends_with_the_job(tmp_path):
    from gaudi_launch.remote import jobdir
    from tests.helpers import wait_for

    path = tmp_path / "gaudi-launch-5ca1ab1f"
    jobdir.create(str(path))
    before = set(os.listdir("/proc"))
    jobdir.remove_when_gone(str(path), "5ca1ab1f")
    found: list[int] = []
    assert wait_for(
        lambda: (
            found.extend(int(p) for p in set(os.listdir("/proc")) - before if p.isdigit() and _is_watch(p)) or found
        ),
        timeout=15,
    )
    watcher = found[0]
    jobdir.remove([str(path)])
    jobdir.stop_watch(str(path))
    assert wait_for(lambda: not os.path.exists(f"/proc/{watcher}") or _zombie(watcher), timeout=15)


def _is_watch(pid: str) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"gaudi_launch.remote.jobdir\0watch" in f.read()
    except OSError:
        return False


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


# A rank (uid 65534, a session of its own) whose `sudo -u OTHER` child outlives it, then the rank exits: the
# child, of another user, carries no readable job id and no job process is left in its session.
ORPHAN = """
import os, sys, time
me, other, pid_file = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
os.setsid()
child = os.fork()
if child == 0:
    os.setgroups([]); os.setgid(other); os.setuid(other)
    os.execve("/bin/sleep", ["sleep", "120"], {"GAUDI_LAUNCH_JOB_ID": "0rphan00"})
with open(pid_file + ".tmp", "w") as f:
    f.write(f"{os.getpid()} {child}")
os.replace(pid_file + ".tmp", pid_file)
os._exit(0)
"""


def test_another_users_process_left_by_an_exited_rank_is_reported_with_the_ranks_session(tmp_path):
    import time

    from gaudi_launch.remote.teardown import KILL_CODE, kill_args, parse_sweep
    from tests.helpers import wait_for

    me, other = 65534, other_uid()
    since = time.time() - 1
    pid_file = tmp_path / "orphan.pid"
    subprocess.run([sys.executable, "-c", ORPHAN, str(me), str(other), str(pid_file)], timeout=30, check=True)
    assert wait_for(pid_file.exists, timeout=30)
    rank, orphan = map(int, pid_file.read_text().split())
    try:

        def sweep(groups):
            res = subprocess.run(
                ["/usr/bin/python3", "-S", "-c", KILL_CODE, *kill_args("0rphan00", 0, since, groups)],
                user=me,
                group=me,
                extra_groups=[],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert res.returncode == 0, res.stderr
            return [u for u in parse_sweep(res.stdout).unseen if u.startswith(f"pid {orphan} ")]

        assert sweep([]) == []  # what the review found: passed over in silence
        (found,) = sweep([rank])  # the rank's session id, handed to the sweep
        assert "another user's process in the job's session" in found
    finally:
        os.kill(orphan, 9)


# The same orphan, its environment reset (`sudo -u` keeps no job id), the rank exited: as root, the sweep reads
# every environment and found no job id in it, so it was passed over even with the rank's group handed in.
ORPHAN_NO_ID = ORPHAN.replace('{"GAUDI_LAUNCH_JOB_ID": "0rphan00"}', "{}")


def test_another_users_process_left_by_an_exited_rank_is_reported_to_a_root_sweep(tmp_path):
    import time

    from gaudi_launch.remote.teardown import KILL_CODE, kill_args, parse_sweep
    from tests.helpers import wait_for

    if os.geteuid() != 0:
        pytest.skip("the sweep must run as root")
    since = time.time() - 1
    pid_file = tmp_path / "orphan.pid"
    subprocess.run([sys.executable, "-c", ORPHAN_NO_ID, "0", str(other_uid()), str(pid_file)], timeout=30, check=True)
    assert wait_for(pid_file.exists, timeout=30)
    rank, orphan = map(int, pid_file.read_text().split())
    try:
        res = subprocess.run(
            [sys.executable, "-S", "-c", KILL_CODE, *kill_args("0rphan00", 0, since, [rank])],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert res.returncode == 0, res.stderr
        found = [u for u in parse_sweep(res.stdout).unseen if u.startswith(f"pid {orphan} ")]
        assert found == [
            f"pid {orphan} (sleep, uid {other_uid()}): another user's process in the job's session; "
            "its environment has no job id"
        ]
    finally:
        os.kill(orphan, 9)


def test_a_slurm_master_port_another_user_took_first_is_named_by_rank_0(tmp_path):
    """Under Slurm the port follows from the public job id: rank 0 names who took it first."""
    from gaudi_launch.inputs.ports import pick_free_port
    from tests.helpers import wait_for

    port = pick_free_port()
    listen = (
        "import socket, time\ns = socket.socket()\ns.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
        f"s.bind(('', {port}))\ns.listen()\nprint('up', flush=True)\ntime.sleep(120)\n"
    )
    squatter = subprocess.Popen(
        ["/usr/bin/python3", "-S", "-c", listen],
        user=other_uid(),
        group=other_uid(),
        extra_groups=[],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert squatter.stdout.readline().strip() == "up"
        check = f"from gaudi_launch.process import worker; worker._check_master_port({{'RANK': '0', 'MASTER_PORT': '{port}'}})"
        res = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=60)
        assert res.returncode == 2, res.stdout + res.stderr
        assert f"master port {port} is already taken on this node by user {OTHER_NAME}" in res.stderr
        assert wait_for(lambda: squatter.poll() is None, timeout=1)
    finally:
        squatter.kill()


# ---- item 2: the review's writers, against another user's planted link ----------------------------------


@pytest.fixture
def planted(tmp_path):
    """A shared (1777) directory and a root-owned file another user's link points at."""
    shared_dir, victim = tmp_path / "team", tmp_path / "etc-file"
    shared_dir.mkdir()
    os.chmod(shared_dir, 0o1777)
    victim.write_text("root's\n")

    def plant(name: str):
        link = shared_dir / name
        link.symlink_to(victim)
        os.lchown(link, other_uid(), other_uid())
        return link

    return shared_dir, victim, plant


def test_collective_check_json_replaces_a_planted_link(planted):
    from gaudi_launch.collective import write_finding
    from gaudi_launch.reports.collective import CollectiveReport

    shared_dir, victim, plant = planted
    link = plant("collective-check.json")
    report = CollectiveReport([], None, None, None, None, None, 0, "tcp")
    assert write_finding(report, str(shared_dir)) == str(link)
    assert victim.read_text() == "root's\n" and not link.is_symlink() and '"hosts"' in link.read_text()


def test_metrics_jsonl_is_not_written_through_a_planted_link(planted):
    from gaudi_launch.runtime.metrics import MetricsWriter

    shared_dir, victim, plant = planted
    plant("metrics.jsonl")
    with pytest.raises(OSError):
        MetricsWriter(str(shared_dir), tensorboard=False)
    assert victim.read_text() == "root's\n"


def test_a_watch_whose_directory_went_ends_without_being_told(tmp_path):
    from gaudi_launch.remote import jobdir
    from tests.helpers import wait_for

    path = tmp_path / "gaudi-launch-5ca1ab20"
    jobdir.create(str(path))
    before = set(os.listdir("/proc"))
    jobdir.remove_when_gone(str(path), "5ca1ab20")
    found: list[int] = []
    assert wait_for(
        lambda: (
            found.extend(int(p) for p in set(os.listdir("/proc")) - before if p.isdigit() and _is_watch(p)) or found
        ),
        timeout=15,
    )
    jobdir.remove([str(path)])  # as a test's clean-up does, with the launcher (this process) still alive
    try:
        assert wait_for(lambda: not os.path.exists(f"/proc/{found[0]}") or _zombie(found[0]), timeout=15)
    finally:
        jobdir.stop_watch(str(path))
