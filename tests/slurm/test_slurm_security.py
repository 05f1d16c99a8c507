"""Issue 36 item 9 under srun, on the real Slurm cluster: another user's process a remote rank left behind
(a `sudo -u` orphan with a reset environment) is reported by the job-end sweep, which gets the process groups
the ranks led, one list per node. No namespaces of its own: it uses the session's Slurm cluster (gls)."""

from __future__ import annotations

import os

from tests.cluster.test_security import ORPHAN
from tests.helpers import alive
from tests.other_user import other_uid
from tests.slurm.test_slurm_backend import LAUNCH, launch


def test_another_users_process_left_by_an_exited_rank_is_reported_under_srun(slurm_cluster, tmp_path):
    other = other_uid()
    script = tmp_path / "orphan.py"
    script.write_text(ORPHAN)
    pid_file = tmp_path / "orphan.pid"
    argv = ["salloc", "-N2", "--ntasks-per-node=1", *LAUNCH, "--grace", "3", str(script), str(pid_file), str(other)]
    r = launch(slurm_cluster, argv)
    orphan = int(pid_file.read_text())
    try:
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        found = [line for line in r.stderr.splitlines() if line.startswith("gaudi-launch: on gls-n1,")]
        assert any(
            f"pid {orphan} (sleep, uid {other}): another user's process in the job's session" in line for line in found
        ), r.stderr[-3000:]
    finally:
        if alive(orphan):
            os.kill(orphan, 9)
