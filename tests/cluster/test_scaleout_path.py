"""Dry runs and a job on the namespace cluster whose hosts are stood-in Gaudi servers (issues 24 and 32): each
host's login puts the hl-smi and fi_info stand-ins (tests/standin/bin, tests/standin/fabric) first on PATH, says
which server it is, and points the probe at a stand-in tree of its own (gaudi_tools.host_tree: the sysfs RDMA
devices and card NUMA nodes, /proc/kallsyms, the OFI wrapper). The launcher runs on gl-n0, a login node outside
the hostfile, so every host of the job is probed over its own sshd.

The verbs profile runs end to end (plan, pre-flight, job): Gaudi 3 on Mellanox host NICs with its Gaudi
scale-out ports disabled takes "P1 if libfabric was built --with-synapseai and PCIe ACS is off, else P2", and
the ranks get MLX5_SCATTER_TO_CQE=0 and the OFI wrapper's directory (HabanaAI/HCL setScaleoutMode,
ofi_plugin.cpp). Uncabled enabled ports fail the pre-flight; DL1 keeps its EFA recipe. Hosts use 2 of their 8
cards, so every run says --allow-partial-nodes (item 6), and the warning shows it."""

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
# A rank that writes what it inherited of the scale-out variables: the job's part of "end to end".
RANK_ENV = """import json, os, sys
names = ("MLX5_SCATTER_TO_CQE", "RDMAV_HUGEPAGES_SAFE", "RDMAV_FORK_SAFE", "HCCL_OVER_OFI", "LD_LIBRARY_PATH")
with open(os.path.join(sys.argv[1], os.environ["RANK"] + ".json"), "w") as f:
    json.dump({n: os.environ.get(n) for n in names}, f)
"""


def sysfs_copy(root) -> str:
    """The part of /sys the probe reads for binding: each card's numa_node (index 0-3 on node 0, 4-7 on node 1)
    and each node's cpulist."""
    for index, bus in enumerate(GAUDI3_BUSES):
        d = root / "bus" / "pci" / "devices" / bus
        d.mkdir(parents=True)
        (d / "numa_node").write_text(f"{index // 4}\n")
    for node, cpus in NODE_CPUS.items():
        d = root / "devices" / "system" / "node" / f"node{node}"
        d.mkdir(parents=True)
        (d / "cpulist").write_text(cpus + "\n")
    return str(root)


def _host_rc(tmp_path, servers: dict[str, dict[str, str]]):
    """The login file each host sources: its server's variables and its own stand-in tree."""
    cases = []
    for host, values in servers.items():
        root = tmp_path / "hosts" / host
        sysfs_copy(root / "sys")
        values = {**values, **gaudi_tools.host_tree(root, values)}
        cases.append(f"{host})\n{gaudi_tools.shell_lines(values)};;\n")
    rc = tmp_path / "standin-host.sh"
    rc.write_text(f'case "$(hostname)" in\n{"".join(cases)}esac\n')
    return rc


def launch(cluster, tmp_path, servers: dict[str, dict[str, str]], *args: str, script=(SMOKE,), slots: int = 2):
    """gaudi-launch (mpirun backend) from gl-n0 for gl-n1 and gl-n2, each host the server of ``servers[host]``
    (gaudi_tools.settings)."""
    # sshd sets PATH after the client's variables, and bash run by sshd reads ~/.bashrc, not BASH_ENV, when it
    # is a top-level shell (SHLVL < 2: bash's shell.c, run_startup_files). The client sends SHLVL=1 and BASH_ENV
    # (the cluster's sshd has AcceptEnv *): the login shell then sources this file before the probe, as any
    # non-interactive bash does, and each host picks its server by its hostname.
    rc = _host_rc(tmp_path, servers)
    config = tmp_path / "ssh_config"
    with open(cluster.ssh_config) as f:
        config.write_text("SendEnv BASH_ENV SHLVL\n" + f.read())
    env = cluster.env()
    env["BASH_ENV"], env["SHLVL"] = str(rc), "1"
    for name in ("HCCL_OVER_OFI", "PT_HPU_RECIPE_CACHE_CONFIG", "HABANA_VISIBLE_MODULES", "TMPDIR", "HCCL_OFI_WRAPPER"):
        env.pop(name, None)
    env.pop("LD_LIBRARY_PATH", None)
    hostfile = cluster.hostfile(slots=slots, hosts=[1, 2])
    argv = launch_argv(cluster, "mpirun", hostfile, "--allow-partial-nodes", *args, *script)
    argv[argv.index(cluster.ssh_config)] = str(config)
    return cluster.run_on(0, argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)


def dry_run(cluster, tmp_path, servers, *args):
    return launch(cluster, tmp_path, servers, "--dry-run", *args)


def binding(host: str) -> list[str]:
    """What the plan says of ``host``'s two ranks: module ids 0 and 1 (card indices 6 and 7, on NUMA node 1),
    half of node 1's cores each, with their hyperthreads."""
    return [
        f"{host} local rank 0 (card module 0, NUMA node 1): cores 16-23,48-55",
        f"{host} local rank 1 (card module 1, NUMA node 1): cores 24-31,56-63",
    ]


def test_gaudi3_verbs_cluster_end_to_end_plan_preflight_and_job(cluster, tmp_path):
    servers = {h: gaudi_tools.settings("gaudi3-verbs") for h in HOSTS}
    res = dry_run(cluster, tmp_path / "plan", servers, "--json")
    assert res.returncode == 0, res.stderr
    plan = json.loads(res.stdout)
    for host in HOSTS:
        path = plan["scaleout"][host]
        assert (path["path"], path["else"], path["page"]) == ("P1", "P2", scaleout.SCALE_OUT_PAGE)
        assert path["if"] == ["libfabric was built --with-synapseai", "PCIe ACS is off"]
        assert path["why"].startswith(
            "Gaudi 3 (HL-325L), no Gaudi scale-out port enabled; verbs NIC mlx5_0, mlx5_1, libfabric 1.22.0 >= 1.20, "
            "ib_umem_dmabuf_get in /proc/kallsyms"
        )
        assert path["env"] == scaleout.VERBS_GDR_ENV
    env = plan["env"]
    assert "HCCL_OVER_OFI" not in env and "FI_EFA_USE_DEVICE_RDMA" not in env
    assert env["MLX5_SCATTER_TO_CQE"] == "0" and env["RDMAV_HUGEPAGES_SAFE"] == "1"
    # each host found the wrapper in its own tree: both directories, so dlopen resolves on either
    wrappers = [str(tmp_path / "plan" / "hosts" / h / "ofi") for h in HOSTS]
    assert env["LD_LIBRARY_PATH"].split(":")[:2] == wrappers
    notes = plan["notes"]
    for host in HOSTS:
        assert all(f"  {line}" in notes for line in binding(host)), notes
    assert plan["preflight"]["ok"]
    assert any(w.startswith("partial nodes in a job of several hosts") for w in plan["preflight"]["warnings"])

    # the job: each rank inherits the plan's scale-out variables
    out = tmp_path / "ranks"
    out.mkdir()
    script = tmp_path / "rank_env.py"
    script.write_text(RANK_ENV)
    res = launch(cluster, tmp_path / "job", servers, script=(str(script), str(out)))
    assert res.returncode == 0, res.stdout + res.stderr
    got = {p.stem: json.loads(p.read_text()) for p in out.glob("*.json")}
    assert sorted(got) == ["0", "1", "2", "3"]
    for rank_env in got.values():
        assert rank_env["MLX5_SCATTER_TO_CQE"] == "0" and rank_env["HCCL_OVER_OFI"] is None
        assert str(tmp_path / "job" / "hosts" / "gl-n1" / "ofi") in rank_env["LD_LIBRARY_PATH"].split(":")


def test_dl1_cluster_dry_run_keeps_the_efa_recipe(cluster, tmp_path):
    res = dry_run(cluster, tmp_path, {h: gaudi_tools.settings("dl1") for h in HOSTS}, "--json")
    assert res.returncode == 0, res.stderr
    plan = json.loads(res.stdout)
    assert {h: p["path"] for h, p in plan["scaleout"].items()} == {"gl-n1": "P2", "gl-n2": "P2"}
    assert plan["env"]["HCCL_OVER_OFI"] == "1" and "FI_EFA_USE_DEVICE_RDMA" not in plan["env"]
    assert plan["env"]["LD_LIBRARY_PATH"].startswith("/root/hccl_ofi_wrapper:/opt/amazon/openmpi/lib")


def test_uncabled_enabled_gaudi_ports_fail_the_preflight_with_the_remedy(cluster, tmp_path):
    """gl-n1 has its Gaudi scale-out ports disabled (host NICs); gl-n2 left them enabled and uncabled: HCCL
    would take the Gaudi NICs there and hang, so the pre-flight fails on gl-n2 alone and says how to fix it."""
    servers = {"gl-n1": gaudi_tools.settings("gaudi3-verbs"), "gl-n2": gaudi_tools.settings("gaudi3-uncabled")}
    res = dry_run(cluster, tmp_path, servers)
    assert res.returncode == 3, res.stderr  # the plan is shown; a real run would start nothing
    text = res.stdout
    assert "note: scale-out gl-n1: P1 host NIC Gaudi Direct (verbs) if libfabric was built --with-synapseai" in text
    assert "pre-flight: FAILED" in text and "  gl-n1  OK  " in text
    row = next(line for line in text.splitlines() if line.startswith("  gl-n2  failed  "))
    assert "Gaudi scale-out NIC port(s) enabled but down: 0000:1b:00.0 port 8, 0000:1b:00.0 port 22" in row, text
    fix = text.split(row, 1)[1].splitlines()[1].strip()
    assert (
        fix.startswith("fix: HCCL takes the Gaudi NICs whenever a scale-out port is enabled") and "hl-fw-loader" in fix
    )
