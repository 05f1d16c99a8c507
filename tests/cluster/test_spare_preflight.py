"""Issue 27 item 9: spare hosts (--spare-hosts) are pre-flighted with the others, so that --check-only
and --dry-run do not call a job OK whose spare cannot run it; a failing spare is a warning naming it,
not a failed pre-flight (the job can run without it). On the session's cluster, launcher on gl-n0."""

from __future__ import annotations

import json
import sys


def spare_job(cluster, tmp_path, *mode):
    # The spare is reached as a user whose login the cluster refuses: the other two hosts are fine.
    hostfile = tmp_path / "hostfile"
    names = cluster.names
    hostfile.write_text(f"{names[0]} slots=1\n{names[1]} slots=1\nnobody@{names[2]} slots=1\n")
    (tmp_path / "job.py").write_text("print('ran')\n")
    argv = [sys.executable, "-m", "gaudi_launch", *mode, "--hostfile", str(hostfile)]
    argv += ["--ssh-config", cluster.ssh_config, "--max-restarts", "1", "--spare-hosts", "1", "job.py"]
    return cluster.run_on(0, argv, env=cluster.env(), cwd=str(tmp_path), capture_output=True, text=True, timeout=120)


def test_check_only_checks_the_spare_and_warns_by_name(cluster, tmp_path):
    res = spare_job(cluster, tmp_path, "--check-only")
    assert res.returncode == 0, res.stdout + res.stderr  # the job's own hosts are fine
    spare = f"nobody@{cluster.names[2]}"
    lines = [line for line in res.stdout.splitlines() if line.startswith("warning: spare host")]
    assert len(lines) == 1 and lines[0].startswith(f"warning: spare host {spare} failed the pre-flight: "), res.stdout
    assert "it cannot take a lost host's place" in lines[0]
    assert [line.split()[0] for line in res.stdout.splitlines()[1:3]] == cluster.names[:2]  # the table: job hosts


def test_dry_run_shows_the_failed_spare_in_its_findings(cluster, tmp_path):
    res = spare_job(cluster, tmp_path, "--dry-run", "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    plan = json.loads(res.stdout)
    assert plan["preflight"]["ok"] is True
    assert [h["host"] for h in plan["preflight"]["hosts"]] == cluster.names[:2]
    warned = [w for w in plan["preflight"]["warnings"] if w.startswith("spare host ")]
    assert len(warned) == 1 and f"nobody@{cluster.names[2]}" in warned[0]
    assert any(n.startswith(f"spare host nobody@{cluster.names[2]} failed the pre-flight") for n in plan["notes"])
