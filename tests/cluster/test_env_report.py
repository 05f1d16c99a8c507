"""`gaudi-launch env --hostfile`: every host's versions side by side over real SSH, differences marked."""

from __future__ import annotations

import json
import subprocess
import sys


def test_env_reports_every_host_and_marks_what_differs(cluster, tmp_path):
    hostfile = cluster.hostfile(slots=1, hosts=[0, 1])
    argv = [sys.executable, "-m", "gaudi_launch", "env", "--hostfile", hostfile, "--ssh-config", cluster.ssh_config]
    # from host 0: itself directly, host 1 over ssh
    res = cluster.run_on(0, argv, env=cluster.env(), cwd=str(tmp_path), capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    header = next(line for line in lines if cluster.names[0] in line and cluster.names[1] in line)
    assert header.split() == [cluster.names[0], "|", cluster.names[1]]
    torch_row = next(line for line in lines if line[2:].startswith("torch "))
    assert torch_row.startswith("  ")  # the same torch everywhere: not marked
    # host 0 restricted to one Gaudi module, host 1 not: both rows marked
    env = dict(cluster.env(), HABANA_VISIBLE_MODULES="3")
    res = cluster.run_on(0, argv, env=env, cwd=str(tmp_path), capture_output=True, text=True, timeout=120)
    marked = {line[2:].split()[0] for line in res.stdout.splitlines() if line.startswith("* ")}
    assert marked == {"devices", "HABANA_VISIBLE_MODULES"}, res.stdout
    res = cluster.run_on(
        0, argv + ["--json"], env=cluster.env(), cwd=str(tmp_path), capture_output=True, text=True, timeout=120
    )
    data = json.loads(res.stdout)
    assert set(data["hosts"]) == set(cluster.names[:2]) and data["unreachable"] == {}
    # a host that does not answer is named, with exit 3
    cluster.stop_sshd(1)
    try:
        res = cluster.run_on(0, argv, env=cluster.env(), cwd=str(tmp_path), capture_output=True, text=True, timeout=120)
    finally:
        cluster.start_sshd(1)
    assert res.returncode == 3 and f"! {cluster.names[1]}: ssh exited" in res.stdout


def test_env_from_a_login_node_reports_each_hosts_own_nics(cluster, tmp_path):
    hostfile = cluster.hostfile(slots=1, hosts=[0, 1])
    res = subprocess.run(
        cluster.login_argv(
            [sys.executable, "-m", "gaudi_launch", "env", "--hostfile", hostfile, "--ssh-config", cluster.ssh_config]
        ),
        env=cluster.env(),
        cwd=str(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    nics = next(line for line in res.stdout.splitlines() if line[2:].startswith("NICs "))
    assert not nics.startswith("* ") and nics.count("eth0, lo") == 2  # each host's own: eth0 and lo
