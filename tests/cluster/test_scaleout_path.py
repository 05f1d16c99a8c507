"""A dry run on the namespace cluster whose hosts have the Gaudi 3 host-NIC stand-ins of hl-smi and fi_info
(tests/standin/gaudi_tools.py) on their PATH (issue 24, item 1): every host is probed over its own sshd and
takes host NIC Gaudi Direct (P1), with no HCCL_OVER_OFI; with the DL1 stand-ins, today's EFA recipe."""

from __future__ import annotations

import json

import pytest

from tests.cluster.test_multinode import ROOT, SMOKE, launch_argv
from tests.standin import gaudi_tools


@pytest.mark.parametrize("profile", ["gaudi3-hostnic", "dl1"])
def test_dry_run_on_stood_in_hosts(cluster, tmp_path, profile):
    tools = gaudi_tools.install(str(tmp_path / "tools"), profile)
    # sshd sets PATH itself after the client's variables, so the stand-ins reach the remote login through
    # BASH_ENV (the cluster's sshd has AcceptEnv *; root's login shell, bash, sources it before the probe)
    rc = tmp_path / "standin-path.sh"
    rc.write_text(f'PATH="{tools}:$PATH"\n')
    config = tmp_path / "ssh_config"
    with open(cluster.ssh_config) as f:
        config.write_text("SendEnv BASH_ENV\n" + f.read())
    env = cluster.env()
    env["PATH"] = f"{tools}:{env['PATH']}"
    env["BASH_ENV"] = str(rc)
    hostfile = cluster.hostfile(slots=2, hosts=[0, 1])
    argv = launch_argv(cluster, "mpirun", hostfile, "--dry-run", "--json", SMOKE)
    argv[argv.index(cluster.ssh_config)] = str(config)
    res = cluster.run_on(0, argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    plan = json.loads(res.stdout)
    paths = {h: p["path"] for h, p in plan["scaleout"].items()}
    if profile == "dl1":  # first-generation Gaudi over EFA: today's recipe
        assert paths == {"gl-n0": "P2", "gl-n1": "P2"}
        assert plan["env"]["HCCL_OVER_OFI"] == "1" and "FI_EFA_USE_DEVICE_RDMA" not in plan["env"]
        assert plan["env"]["LD_LIBRARY_PATH"].startswith("/root/hccl_ofi_wrapper:/opt/amazon/openmpi/lib")
        return
    assert paths == {"gl-n0": "P1", "gl-n1": "P1"}
    assert "HCCL_OVER_OFI" not in plan["env"]
    assert plan["env"]["FI_EFA_USE_DEVICE_RDMA"] == "1" and plan["env"]["RDMAV_FORK_SAFE"] == "1"
    assert any(n.startswith("scale-out gl-n1: P1 host NIC Gaudi Direct (EFA)") for n in plan["notes"]), plan["notes"]
