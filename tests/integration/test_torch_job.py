"""A real torch.distributed (gloo) job launched by gaudi-launch, from the CLI and from Python."""

from __future__ import annotations

import io
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMOKE = os.path.join(ROOT, "scripts", "allreduce_smoke.py")


def test_two_rank_gloo_allreduce_through_the_cli(tmp_path):
    res = subprocess.run(
        [sys.executable, "-m", "gaudi_launch", "--num_devices", "2", "--log-dir", str(tmp_path), SMOKE],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    for rank in (0, 1):
        line = f"[rank {rank}] rank {rank}/2 on"
        assert line in res.stdout
        assert "all_reduce sum = 3, expected 3: OK" in (tmp_path / f"rank-{rank}.log").read_text()


def test_two_rank_gloo_allreduce_through_distributed_runner():
    from gaudi_launch import DistributedRunner

    before = dict(os.environ)
    out, err = io.StringIO(), io.StringIO()
    runner = DistributedRunner([f"{SMOKE}"], world_size=2, master_port=None, stdout=out, stderr=err)
    assert runner.run() == 0, err.getvalue()
    assert runner.result.exit_codes == {0: 0, 1: 0}
    assert out.getvalue().count("expected 3: OK") == 2
    assert dict(os.environ) == before


def test_distributed_runner_reports_the_failing_rank(tmp_path):
    from gaudi_launch import DistributedRunner

    bad = tmp_path / "bad.py"
    bad.write_text("import os, sys, time\nif os.environ['RANK'] == '1':\n    sys.exit(7)\ntime.sleep(60)\n")
    runner = DistributedRunner(
        [str(bad), str(bad)], world_size=2, master_port=None, grace=5, stdout=io.StringIO(), stderr=io.StringIO()
    )
    assert runner.run() == 7
    assert len(runner.results) == 1  # stopped at the first failing command
    assert runner.result.first_failure.rank == 1
    assert "first failure: rank 1" in runner.result.summary


def test_two_rank_gloo_allreduce_through_deepspeed_on_one_host(tmp_path):
    res = subprocess.run(
        [sys.executable, "-m", "gaudi_launch", "--num_devices", "2", "--backend", "deepspeed", SMOKE],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=str(tmp_path),
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert res.stdout.count("all_reduce sum = 3, expected 3: OK") == 2
