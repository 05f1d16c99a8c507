"""Dry runs on the namespace cluster whose hosts are stood-in Gaudi servers (issue 24): each host's login puts
the hl-smi and fi_info stand-ins (tests/standin/bin, tests/standin/fabric) first on PATH and says which server
it is, and its cards' NUMA nodes come from a sysfs copy. The launcher runs on gl-n0, a login node outside the
hostfile, so every host of the job is probed over its own sshd. One Gaudi 3 cluster with host NICs shows, per
host, the scale-out path and why, the module ids of its cards, the cores each rank is bound to and the
compiled-graph cache; the DL1 profile keeps today's EFA recipe; a Gaudi 3 host with a scale-out port down is a
pre-flight finding with its fix."""

from __future__ import annotations

import json

from gaudi_launch.plan import scaleout
from tests.cluster.test_multinode import ROOT, SMOKE, launch_argv
from tests.standin import gaudi_tools

HOSTS = ("gl-n1", "gl-n2")
# Gaudi 3 bus ids of the hl-smi stand-in by card index; modules 0-3 sit on indices 4-7 (index -> module
# 4->2, 5->3, 6->0, 7->1), which this sysfs puts on NUMA node 1
GAUDI3_BUSES = [
    "0000:1b:00.0",
    "0000:1c:00.0",
    "0000:3d:00.0",
    "0000:3e:00.0",
    "0000:9d:00.0",
    "0000:9e:00.0",
    "0000:bd:00.0",
    "0000:be:00.0",
]
NODE_CPUS = {0: "0-15,32-47", 1: "16-31,48-63"}  # 2 sockets, 16 cores each, their hyperthreads from 32


def sysfs_copy(root) -> str:
    """The part of /sys the probe reads: each card's numa_node (index 0-3 on node 0, 4-7 on node 1) and each
    node's cpulist."""
    for index, bus in enumerate(GAUDI3_BUSES):
        d = root / "bus" / "pci" / "devices" / bus
        d.mkdir(parents=True)
        (d / "numa_node").write_text(f"{index // 4}\n")
    for node, cpus in NODE_CPUS.items():
        d = root / "devices" / "system" / "node" / f"node{node}"
        d.mkdir(parents=True)
        (d / "cpulist").write_text(cpus + "\n")
    return str(root)


def dry_run(cluster, tmp_path, servers: dict[str, dict[str, str]], *args: str, slots: int = 2):
    """gaudi-launch --dry-run (mpirun backend) from gl-n0 for gl-n1 and gl-n2, each host the server of
    ``servers[host]`` (gaudi_tools.settings)."""
    # sshd sets PATH after the client's variables, and bash run by sshd reads ~/.bashrc, not BASH_ENV, when it
    # is a top-level shell (SHLVL < 2: bash's shell.c, run_startup_files). The client sends SHLVL=1 and BASH_ENV
    # (the cluster's sshd has AcceptEnv *): the login shell then sources this file before the probe, as any
    # non-interactive bash does, and each host picks its server by its hostname.
    cases = "".join(f"{host})\n{gaudi_tools.shell_lines(values)};;\n" for host, values in servers.items())
    rc = tmp_path / "standin-host.sh"
    rc.write_text(
        f'case "$(hostname)" in\n{cases}esac\nGAUDI_LAUNCH_SYSFS={sysfs_copy(tmp_path / "sys")}; export GAUDI_LAUNCH_SYSFS\n'
    )
    config = tmp_path / "ssh_config"
    with open(cluster.ssh_config) as f:
        config.write_text("SendEnv BASH_ENV SHLVL\n" + f.read())
    env = cluster.env()
    env["BASH_ENV"], env["SHLVL"] = str(rc), "1"
    for name in ("HCCL_OVER_OFI", "PT_HPU_RECIPE_CACHE_CONFIG", "HABANA_VISIBLE_MODULES", "TMPDIR"):
        env.pop(name, None)
    hostfile = cluster.hostfile(slots=slots, hosts=[1, 2])
    argv = launch_argv(cluster, "mpirun", hostfile, "--dry-run", *args, SMOKE)
    argv[argv.index(cluster.ssh_config)] = str(config)
    return cluster.run_on(0, argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)


def binding(host: str) -> list[str]:
    """What the plan says of ``host``'s two ranks: module ids 0 and 1 (card indices 6 and 7, on NUMA node 1),
    half of node 1's cores each, with their hyperthreads."""
    return [
        f"{host} local rank 0 (card module 0, NUMA node 1): cores 16-23,48-55",
        f"{host} local rank 1 (card module 1, NUMA node 1): cores 24-31,56-63",
    ]


def test_gaudi3_cluster_dry_run_shows_path_modules_binding_and_recipe_cache(cluster, tmp_path):
    servers = {h: gaudi_tools.settings("gaudi3-hostnic") for h in HOSTS}
    res = dry_run(cluster, tmp_path, servers, "--json")
    assert res.returncode == 0, res.stderr
    plan = json.loads(res.stdout)
    for host in HOSTS:
        path = plan["scaleout"][host]
        # Gaudi 3, its scale-out ports not cabled, EFA with libfabric 1.22 on kernel >= 5.12: Gaudi Direct
        assert path["path"] == "P1" and path["page"] == scaleout.SCALE_OUT_PAGE
        assert path["why"].startswith(
            "Gaudi 3 (HL-325L), its scale-out ports down; EFA, libfabric 1.22.0amzn4.0 >= 1.16.1"
        )
        assert path["env"] == {"RDMAV_FORK_SAFE": "1", "FI_EFA_USE_DEVICE_RDMA": "1"}
    assert "HCCL_OVER_OFI" not in plan["env"]
    assert plan["env"]["FI_EFA_USE_DEVICE_RDMA"] == "1" and plan["env"]["RDMAV_FORK_SAFE"] == "1"
    notes = plan["notes"]
    for host in HOSTS:
        assert all(f"  {line}" in notes for line in binding(host)), notes
    cache = f"/gaudi-launch-{plan['job_id']}/recipe-cache,false,1024"
    assert any(
        n.startswith("compiled-graph cache: each rank sets PT_HPU_RECIPE_CACHE_CONFIG to the job's directory on its")
        and cache in n
        for n in notes
    ), notes
    assert plan["preflight"]["ok"]

    res = dry_run(cluster, tmp_path / "text", servers)
    assert res.returncode == 0, res.stderr
    text = res.stdout
    assert "HCCL_OVER_OFI" not in text
    assert "  FI_EFA_USE_DEVICE_RDMA=1\n" in text and "  RDMAV_FORK_SAFE=1\n" in text
    for host in HOSTS:
        assert f"note: scale-out {host}: P1 host NIC Gaudi Direct (EFA): Gaudi 3 (HL-325L), its scale-out ports" in text
        assert all(f"note:   {line}\n" in text for line in binding(host)), text
    assert (
        "note: compiled-graph cache: each rank sets PT_HPU_RECIPE_CACHE_CONFIG" in text
        and "recipe-cache,false,1024" in text
    )


def test_dl1_cluster_dry_run_keeps_the_efa_recipe(cluster, tmp_path):
    res = dry_run(cluster, tmp_path, {h: gaudi_tools.settings("dl1") for h in HOSTS}, "--json")
    assert res.returncode == 0, res.stderr
    plan = json.loads(res.stdout)
    assert {h: p["path"] for h, p in plan["scaleout"].items()} == {"gl-n1": "P2", "gl-n2": "P2"}
    assert plan["env"]["HCCL_OVER_OFI"] == "1" and "FI_EFA_USE_DEVICE_RDMA" not in plan["env"]
    assert plan["env"]["LD_LIBRARY_PATH"].startswith("/root/hccl_ofi_wrapper:/opt/amazon/openmpi/lib")


def test_a_gaudi3_host_with_a_scale_out_port_down_is_a_finding_with_its_fix(cluster, tmp_path):
    """gl-n1's Gaudi NICs are all up (P0); gl-n2's port 22 is down on every card while its others are up, so HCCL
    would take the Gaudi NICs there and the down port breaks the job's collectives: the pre-flight fails on
    gl-n2 alone and says how to fix it."""
    servers = {
        "gl-n1": gaudi_tools.settings("gaudi3-gaudinic"),
        "gl-n2": gaudi_tools.settings("gaudi3-gaudinic", GAUDI_STANDIN_PORTS_DOWN="22"),
    }
    res = dry_run(cluster, tmp_path, servers)
    assert res.returncode == 3, res.stderr  # the plan is shown; a real run would start nothing
    text = res.stdout
    assert "note: scale-out gl-n1: P0 Gaudi NICs: 24 Gaudi scale-out port(s) up" in text
    assert "pre-flight: FAILED" in text and "  gl-n1  OK  " in text
    row = next(line for line in text.splitlines() if line.startswith("  gl-n2  failed  "))
    assert "Gaudi scale-out NIC port(s) down: 0000:1b:00.0 port 22, 0000:1c:00.0 port 22" in row, text
    fix = text.split(row, 1)[1].splitlines()[1].strip()
    assert fix.startswith("fix: check each port with hl-smi -n link -i BUS") and "Disable_Enable_External_NICs" in fix
