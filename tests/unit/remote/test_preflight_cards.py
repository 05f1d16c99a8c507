"""The pre-flight's card checks (issue 24, item 2): one real probe on this host with the hl-smi stand-in on PATH
finds a partial node Habana does not support and a card another process holds, by module id."""

import os
import sys

from gaudi_launch.backends import get_backend
from gaudi_launch.remote.preflight import SshOptions, check_hosts

STANDIN_BIN = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "standin", "bin"))


def probe_here(modules, monkeypatch, busy="", profile="gaudi3"):
    monkeypatch.setenv("PATH", STANDIN_BIN + os.pathsep + os.environ["PATH"])
    monkeypatch.setenv("GAUDI_STANDIN_CARDS", profile)
    monkeypatch.setenv("GAUDI_STANDIN_HL_SMI_BUSY", busy)
    report = check_hosts(
        ["localhost"],
        python=sys.executable,
        script=None,
        cwd=os.getcwd(),
        master_host="localhost",
        master_addr="127.0.0.1",
        master_port=None,
        devices_needed={"localhost": len(modules)},
        modules_needed={"localhost": modules},
        ssh=SshOptions(),
        local=lambda host: True,
    )
    return report.facts["localhost"]


def test_a_card_held_by_another_process_is_named(monkeypatch):
    # index 5 is module 3 on the stand-in's server: modules 2,3 want it
    facts = probe_here([2, 3], monkeypatch, busy="5:4242:python3")
    assert not facts.ok
    assert "card module 3 (index 5) is held by process 4242 (python3)" in facts.reason
    assert "Device acquire failed" in facts.reason and "kill 4242" in facts.fix


def test_an_unsupported_pair_fails_and_a_supported_one_passes(monkeypatch):
    facts = probe_here([0, 3], monkeypatch)
    assert not facts.ok and "module ids 0,3" in facts.reason and "--include" in facts.fix
    assert probe_here([0, 1, 2, 3], monkeypatch, busy="2:99:other").ok  # index 2 is module 7: not wanted


def test_the_probe_reads_numa_facts_and_the_plan_shows_each_hosts_binding(monkeypatch, tmp_path):
    from gaudi_launch.inputs.spec import JobSpec
    from gaudi_launch.plan.planner import build_plan, gaudi_settings
    from tests.unit.plan.test_gaudi_settings import sysfs

    monkeypatch.setenv("GAUDI_STANDIN_CARDS", "gaudi2")
    monkeypatch.setenv("GAUDI_LAUNCH_SYSFS", sysfs(tmp_path, lambda i: i // 4, {0: "0-15,64-79", 1: "16-31,80-95"}))
    facts = probe_here(list(range(8)), monkeypatch, profile="gaudi2")
    assert facts.ok and facts.cards.node_cpus[1] == list(range(16, 32)) + list(range(80, 96))
    # a plan for two other hosts, each as this probe found it
    monkeypatch.chdir(tmp_path)
    (tmp_path / "hostfile").write_text("gaudi-a slots=8\ngaudi-b slots=8\n")
    plan = build_plan(
        JobSpec(program=["x.py"], hostfile="hostfile", backend="mpirun", ssh_check=False), backends=get_backend
    )
    plan.notes.clear()

    notes = "\n".join(gaudi_settings(plan, plan.job, {}, {"gaudi-a": facts, "gaudi-b": facts}).notes)
    # local rank 0 takes module 0 = index 6, on node 1: the first quarter of node 1's cores and their siblings
    assert "gaudi-b local rank 0 (card module 0, NUMA node 1): cores 16-19,80-83" in notes
    assert "gaudi-a local rank 5 (card module 5, NUMA node 0): cores 4-7,68-71" in notes  # 2nd of ranks 4-7
