"""The pre-flight's card checks (issue 24, item 2): one real probe on this host with the hl-smi stand-in on PATH
finds a partial node Habana does not support and a card another process holds, by module id."""

import os
import sys

from gaudi_launch.remote.preflight import SshOptions, check_hosts

STANDIN_BIN = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "standin", "bin"))


def probe_here(modules, monkeypatch, busy=""):
    monkeypatch.setenv("PATH", STANDIN_BIN + os.pathsep + os.environ["PATH"])
    monkeypatch.setenv("GAUDI_STANDIN_CARDS", "gaudi3")
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
