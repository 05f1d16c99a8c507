"""Issue 27 item 6: the job-id sweep (teardown.KILL_CODE) run by an unprivileged user cannot read another
user's environment, so a process of another user that carries the job's id (a rank's `sudo -E -u`)
was passed over in silence. One tied to the job (child, process group or session of a job process)
is now reported, as one of ours closed to inspection already was; an unrelated one is not."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from gaudi_launch.remote.teardown import KILL_CODE, parse_sweep
from tests.helpers import alive, wait_for

ME, OTHER = 65534, 65533
# Run as root: a session whose leader stays root (as slurmstepd or sshd start a job: not the job's),
# with a job process of uid ME, whose child of uid OTHER carries the job id too (a rank's
# `sudo -E -u other`).
TREE = """
import os, sys
job, pid_file = sys.argv[1], sys.argv[2]
os.setsid()
if os.fork() == 0:
    child = os.fork()
    if child == 0:
        os.setgroups([]); os.setgid(OTHER_UID); os.setuid(OTHER_UID)
        os.execve("/bin/sleep", ["sleep", "120"], {"GAUDI_LAUNCH_JOB_ID": job})
    with open(pid_file + ".tmp", "w") as f:
        f.write(f"{os.getpid()} {child}")
    os.replace(pid_file + ".tmp", pid_file)
    os.setgroups([]); os.setgid(ME_UID); os.setuid(ME_UID)
    os.execve("/bin/sleep", ["sleep", "120"], {"GAUDI_LAUNCH_JOB_ID": job})
os.execve("/bin/sleep", ["sleep", "120"], {})
""".replace("OTHER_UID", str(OTHER)).replace("ME_UID", str(ME))


def plain_python_for(uid: int) -> str:
    for python in ("/usr/bin/python3", os.path.realpath(sys.executable)):
        try:
            ok = subprocess.run([python, "-S", "-c", "pass"], user=uid, group=uid, extra_groups=[], timeout=30)
            if ok.returncode == 0:
                return python
        except OSError:
            pass
    pytest.fail(f"no Python interpreter uid {uid} can run")


def test_another_users_process_with_the_job_id_in_the_jobs_session_is_reported(tmp_path):
    if os.geteuid() != 0:
        if os.environ.get("CI") == "true":
            pytest.fail("needs root to make processes of two other users")
        pytest.skip("needs root to make processes of two other users")
    python = plain_python_for(ME)
    job, since = "5a17e27a", time.time() - 1
    pid_file = tmp_path / "other.pid"
    tree = subprocess.Popen([sys.executable, "-c", TREE, job, str(pid_file)])
    # another user's process of its own, started as recently: nothing ties it to the job
    unrelated = subprocess.Popen(["sleep", "120"], user=OTHER, group=OTHER, extra_groups=[], start_new_session=True)
    mine = other = None
    try:
        assert wait_for(pid_file.exists, timeout=30)
        mine, other = map(int, pid_file.read_text().split())
        assert wait_for(lambda: open(f"/proc/{mine}/comm").read().strip() == "sleep", timeout=30)
        res = subprocess.run(
            [python, "-S", "-c", KILL_CODE, job, "0", repr(since)],
            user=ME,
            group=ME,
            extra_groups=[],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert res.returncode == 0, res.stderr
        swept = parse_sweep(res.stdout)
        assert swept.hit == 1  # the job process of its own user
        ours = [u for u in swept.unseen if u.split(" (")[0] in (f"pid {p}" for p in (tree.pid, other, unrelated.pid))]
        assert ours == [
            f"pid {other} (sleep, uid {OTHER}): another user's process in the job's session; its environment "
            "cannot be read"
        ], swept.unseen
    finally:
        for p in (tree.pid, unrelated.pid, mine, other):
            if p and alive(p):
                os.kill(p, 9)
        tree.wait()
        unrelated.wait()
