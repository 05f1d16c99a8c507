"""Issues 25 and 33 under Slurm: the collective check's agents started as one srun step, one task per node of
the allocation. The 3 nodes are network namespaces, so one node's link is throttled both ways with tc's token
bucket, or made to hang (an iptables connbytes rule: its connections stop after 2 MB), as in
tests/cluster/test_collective_check.py. Assertions on orders of magnitude, never absolute times."""

from __future__ import annotations

import contextlib
import json
import subprocess

from tests.helpers import links_hang_after
from tests.slurm.test_slurm_backend import LAUNCH, launch

RATE = "200mbit"  # 25 MB/s: tens of times under a veth pair here


@contextlib.contextmanager
def throttled(cluster, i: int):
    """Node i's link limited to RATE both ways: egress of its eth0, and of the bridge side of its veth."""
    tbf = ["tbf", "rate", RATE, "burst", "64kb", "latency", "200ms"]
    netns = ["ip", "netns", "exec", cluster.names[i]]
    subprocess.run(["tc", "qdisc", "add", "dev", cluster.veths[i], "root", *tbf], check=True)
    subprocess.run([*netns, "tc", "qdisc", "add", "dev", "eth0", "root", *tbf], check=True)
    try:
        yield
    finally:
        subprocess.run(["tc", "qdisc", "del", "dev", cluster.veths[i], "root"], check=False)
        subprocess.run([*netns, "tc", "qdisc", "del", "dev", "eth0", "root"], check=False)


def hung(cluster, i: int):
    """Node i's connections stop carrying data after their first 2 MB, both ways."""
    return links_hang_after(cluster.names[i], 2 << 20)


def test_a_hung_node_is_named_failed_alone(slurm_cluster):
    env = dict(slurm_cluster.env(), GAUDI_LAUNCH_COLLECTIVE_STEP_TIMEOUT="3")
    with hung(slurm_cluster, 2):
        r = launch(
            slurm_cluster, ["salloc", "-N3", "--ntasks-per-node=1", *LAUNCH, "check", "--collective", "--json"], env=env
        )
    assert r.returncode == 3, r.stdout[-3000:] + r.stderr[-3000:]
    data = json.loads(r.stdout[r.stdout.index("{") :])
    assert data["failed"] == ["gls-n2"] and data["slow"] == [] and data["backend"] == "slurm", data
    assert {h["host"]: h["status"] for h in data["hosts"]} == {"gls-n0": "ok", "gls-n1": "ok", "gls-n2": "failed"}


def test_a_healthy_allocation_passes_with_a_figure_per_node(slurm_cluster):
    r = launch(slurm_cluster, ["salloc", "-N3", "--ntasks-per-node=1", *LAUNCH, "check", "--collective", "--json"])
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    data = json.loads(r.stdout[r.stdout.index("{") :])
    assert data["ok"] and data["slow"] == [] and data["failed"] == [] and data["backend"] == "slurm"
    hosts = data["hosts"]
    assert [h["host"] for h in hosts] == slurm_cluster.names and {h["status"] for h in hosts} == {"ok"}
    assert all(h["bandwidth_gbs"] > 0.05 and 0 < h["latency_us"] < 1e5 for h in hosts), hosts


def test_a_throttled_node_is_named_and_left_out_of_the_job(slurm_cluster, tmp_path):
    job = tmp_path / "job.py"
    job.write_text("import os, socket\nprint('JOBHOST', os.environ['RANK'], socket.gethostname())\n")
    salloc = ["salloc", "-N3", "--ntasks-per-node=1", *LAUNCH]
    with throttled(slurm_cluster, 1):
        check = launch(slurm_cluster, [*salloc, "check", "--collective"])
        # the job asks for 2 of the allocation's 3 nodes: the third takes the slow node's place
        run = launch(
            slurm_cluster,
            [*salloc, "--collective-check", "--num_nodes", "2", "--log-dir", str(tmp_path / "l"), str(job)],
        )
        # without a spare node (the job wants all three): exit 3 naming it, nothing started
        alone = launch(slurm_cluster, [*salloc, "--collective-check", "--log-dir", str(tmp_path / "l2"), str(job)])
    assert check.returncode == 3, check.stdout[-3000:] + check.stderr[-3000:]
    rows = {line.split()[0]: line.split() for line in check.stdout.splitlines() if line.startswith("gls-n")}
    assert {h: rows[h][1] for h in slurm_cluster.names} == {"gls-n0": "ok", "gls-n1": "slow", "gls-n2": "ok"}
    bw = {h: float(rows[h][2]) for h in slurm_cluster.names}
    assert bw["gls-n1"] < 0.05 and min(bw["gls-n0"], bw["gls-n2"]) > 5 * bw["gls-n1"], check.stdout
    assert "slow: gls-n1" in check.stderr and "--num_nodes below the allocation" in check.stderr, check.stderr
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    ran = {line.split()[-1] for line in run.stdout.splitlines() if "JOBHOST" in line}
    assert ran == {"gls-n0", "gls-n2"}, run.stdout
    assert "left out by the collective check: gls-n1 (slow" in run.stdout
    assert json.loads((tmp_path / "l" / "collective-check.json").read_text())["slow"] == ["gls-n1"]
    assert alone.returncode == 3 and "JOBHOST" not in alone.stdout, alone.stdout[-3000:] + alone.stderr[-3000:]
    assert "slow: gls-n1" in alone.stderr and "--spare-hosts needs a hostfile" in alone.stderr, alone.stderr
