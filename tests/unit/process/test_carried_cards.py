"""A rank binds its CPUs from the cards the plan carried (wire.HOST_CARDS: what the pre-flight's probe, or the local
or srun probe, read on its host with hl-smi and sysfs) and runs hl-smi itself only when its host's cards did not
come with the job (issue 34: hl-smi costs 0.3-1 s on a Gaudi host, and every rank of a host ran it at once).

The hl-smi here is the recording stand-in (tests/standin/bin/hl-smi with GAUDI_STANDIN_HL_SMI_LOG): each call it
answers is a line in the log, so a test sees whether the rank ran it."""

from __future__ import annotations

import contextlib
import io
import json
import os
import socket
import subprocess
import sys

import pytest

from gaudi_launch.cli import main
from gaudi_launch.inputs import cards
from gaudi_launch.plan import gaudi
from gaudi_launch.wire import DEVICE, HOST_CARDS, JOB_ID, SYSFS
from tests.standin import gaudi_tools

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
STANDIN = os.path.join(ROOT, "tests", "standin")  # the habana_frameworks stand-in, for the launcher's own run
BINDING_QUERY = "hl-smi " + " ".join(cards.QUERY[1:])  # what the rank (cards.read_host) asks hl-smi
SHOW = (
    "import json, os\n"
    "print('SEEN ' + json.dumps({'cpus': sorted(os.sched_getaffinity(0)), 'threads': os.environ.get('OMP_NUM_THREADS')}))\n"
)


def this_machines_cpus() -> list[int]:
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs 2 CPUs: a binding that is not every CPU")
    return cpus


def two_node_sysfs(root, cpus: list[int]) -> str:
    """The stand-in's Gaudi 2 server: cards of index 0-3 on NUMA node 0 (this machine's first CPU), 4-7 on node 1
    (its other CPUs). Module 0, a lone rank's card, is index 6 (the stand-in's map): node 1."""
    for card in cards.parse_query(hl_smi_answer()):
        d = root / "bus" / "pci" / "devices" / card.bus_id
        d.mkdir(parents=True)
        (d / "numa_node").write_text(f"{card.index // 4}\n")
    for node, cpulist in ((0, str(cpus[0])), (1, ",".join(map(str, cpus[1:])))):
        d = root / "devices" / "system" / "node" / f"node{node}"
        d.mkdir(parents=True)
        (d / "cpulist").write_text(cpulist + "\n")
    return str(root)


def hl_smi_answer() -> str:
    return subprocess.run(
        [os.path.join(gaudi_tools.BIN, "hl-smi"), *cards.QUERY[1:]],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, **gaudi_tools.settings("gaudi2", os.environ["PATH"])},
    ).stdout


@pytest.fixture
def standin_host(tmp_path, monkeypatch):
    """This machine as a Gaudi 2 server: the recording hl-smi stand-in first on PATH, its cards in a sysfs copy."""
    cpus = this_machines_cpus()
    log = tmp_path / "hl-smi.log"
    gaudi_tools.apply(monkeypatch, "gaudi2", GAUDI_STANDIN_HL_SMI_LOG=str(log))
    sysfs = two_node_sysfs(tmp_path / "sys", cpus)
    monkeypatch.setenv(SYSFS, sysfs)
    return {"cpus": cpus, "log": log, "sysfs": sysfs}


def calls(log) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def rank_sees(tmp_path, **extra: str) -> dict:
    """A lone rank of a job started as a backend starts it (the rank bootstrap with its layout), and what its script
    saw: the CPUs it runs on and OMP_NUM_THREADS."""
    (tmp_path / "show.py").write_text(SHOW)
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "HABANA_VISIBLE_MODULES", HOST_CARDS)}
    env.update(
        {JOB_ID: "c4a1d0e5", "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"},
        PYTHONPATH=ROOT,
        TMPDIR=str(tmp_path),
        **extra,
    )
    done = subprocess.run(
        [sys.executable, "-u", "-m", "gaudi_launch.process.worker", str(tmp_path / "show.py")],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.split("SEEN ", 1)[1].splitlines()[0])


def test_rank_with_its_hosts_cards_runs_no_hl_smi_stand_in_and_binds_the_same(tmp_path, standin_host):
    log, cpus = standin_host["log"], standin_host["cpus"]
    # without the cards the rank asks hl-smi, as before, and binds to module 0's NUMA node (node 1)
    asked = rank_sees(tmp_path)
    assert calls(log) == [BINDING_QUERY]
    assert asked["cpus"] == cpus[1:] and asked["cpus"] != cpus  # bound, not left on every CPU
    # the cards the probe read on this host (the same hl-smi answer and sysfs), carried: no hl-smi, the same cores
    log.unlink()
    here = cards.read_host(sysfs=standin_host["sysfs"])
    log.unlink()  # (reading them here ran the stand-in once)
    carried = gaudi.carry_cards([(socket.gethostname(), here)])
    assert rank_sees(tmp_path, **{HOST_CARDS: carried}) == asked
    assert calls(log) == []


def test_another_hosts_cards_are_not_used_hl_smi_stand_in(tmp_path, standin_host):
    log, cpus = standin_host["log"], standin_host["cpus"]
    here = cards.read_host(sysfs=standin_host["sysfs"])
    log.unlink()
    # another host's facts that would bind module 0 to this machine's first CPU: not this host's, so not used
    elsewhere = cards.HostCards(
        cards=here.cards, numa_of_bus={c.bus_id: 0 for c in here.cards}, node_cpus={0: [cpus[0]]}
    )
    seen = rank_sees(tmp_path, **{HOST_CARDS: gaudi.carry_cards([(socket.gethostname() + "-other", elsewhere)])})
    assert calls(log) == [BINDING_QUERY]
    assert seen["cpus"] == cpus[1:]
    # the same facts named for this host are taken as they are (what the rank binds from is what came)
    log.unlink()
    assert rank_sees(tmp_path, **{HOST_CARDS: gaudi.carry_cards([(socket.gethostname(), elsewhere)])})["cpus"] == [
        cpus[0]
    ]
    assert calls(log) == []


def test_carried_cards_read_back_as_hl_smi_and_sysfs_give_them_hl_smi_stand_in(standin_host):
    here = cards.read_host(sysfs=standin_host["sysfs"])
    assert len(here.cards) == 8
    four = here.cards[:4]  # a host with 4 of the cards, all on node 0
    other = cards.HostCards(cards=four, numa_of_bus={c.bus_id: 0 for c in four}, node_cpus={0: [0]})
    value = gaudi.carry_cards([("gaudi-a", here), ("gaudi-b", here), ("gaudi-c", other), ("bare", cards.HostCards())])
    assert value is not None
    assert len(json.loads(value)["layouts"]) == 2  # alike hosts share one entry
    assert gaudi.carried_cards(value, "gaudi-a") == here == gaudi.carried_cards(value, "gaudi-b")
    assert gaudi.carried_cards(value, "gaudi-c") == other
    assert gaudi.carried_cards(value, "bare") is None  # no cards there: its ranks read their own
    assert gaudi.carried_cards(value, "gaudi-d") is None
    # one hostname with two different sets of cards: neither is trusted
    assert gaudi.carried_cards(gaudi.carry_cards([("x", here), ("x", other), ("y", here)]) or "", "x") is None
    assert gaudi.carry_cards([(None, here), ("z", None)]) is None
    for garbage in (
        "",
        "{",
        "[]",
        '{"layouts": []}',
        '{"layouts": [[1]]}',
        '{"layouts": [[[[0, 0, "b", 0]], {}, "xy"]]}',
    ):
        assert gaudi.carried_cards(garbage, "x") is None


def test_cards_without_the_ranks_card_are_not_used():
    host = cards.HostCards(
        cards=[cards.Card(0, 0, "0000:19:00.0"), cards.Card(1, 1, "0000:1a:00.0")],
        numa_of_bus={"0000:19:00.0": 0, "0000:1a:00.0": 0},
        node_cpus={0: [0, 1]},
    )
    value = gaudi.carry_cards([("h", host)]) or ""
    layout = {HOST_CARDS: value, "LOCAL_RANK": "0"}
    assert gaudi.rank_cards({**layout, "LOCAL_WORLD_SIZE": "2"}, "h") == host
    assert gaudi.rank_cards({**layout, "LOCAL_WORLD_SIZE": "3"}, "h") is None  # module 2 is not among them
    assert gaudi.rank_cards({**layout, "LOCAL_WORLD_SIZE": "1", "HABANA_VISIBLE_MODULES": "5"}, "h") is None
    assert gaudi.rank_cards({**layout, "LOCAL_WORLD_SIZE": "2"}, "other") is None


def dry_run(*args: str) -> dict:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["--dry-run", "--json", *args])
    assert rc == 0, err.getvalue()
    return json.loads(out.getvalue())


def test_plan_carries_the_probed_cards_hl_smi_stand_in(tmp_path, standin_host, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("")
    plan = dry_run("--num_devices", "1", "train.py")  # the local backend probes this machine
    value = plan["env"][HOST_CARDS]
    assert gaudi.carried_cards(value, socket.gethostname()) == cards.read_host(sysfs=standin_host["sysfs"])
    assert any(HOST_CARDS in note for note in plan["notes"])
    assert HOST_CARDS not in dry_run("--num_devices", "1", "--cpu-bind", "none", "train.py")["env"]


def test_launched_rank_does_not_ask_hl_smi_again_stand_in(tmp_path, standin_host):
    """Through the launcher (local backend): the probe asks hl-smi for the cards once; the rank does not again."""
    log, cpus = standin_host["log"], standin_host["cpus"]
    (tmp_path / "show.py").write_text(SHOW)
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "HABANA_VISIBLE_MODULES")}
    env.update(PYTHONPATH=os.pathsep.join([STANDIN, ROOT]), TMPDIR=str(tmp_path))
    done = subprocess.run(
        [sys.executable, "-m", "gaudi_launch", "--num_devices", "1", str(tmp_path / "show.py")],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.split("SEEN ", 1)[1].splitlines()[0])
    assert seen["cpus"] == cpus[1:]
    assert calls(log).count(BINDING_QUERY) == 1  # the probe's; the rank's own was a second


LOADED = (
    "import json, sys\n"
    "names = ('gaudi_launch.process.cardside', 'gaudi_launch.plan.gaudi', 'gaudi_launch.inputs.cards', "
    "'gaudi_launch.scriptflags', 'dataclasses', 'argparse', 'traceback', 'secrets')\n"
    "print('LOADED ' + json.dumps(sorted(n for n in names if n in sys.modules)))\n"
)


def test_a_rank_on_a_host_without_cards_loads_none_of_the_card_side(tmp_path):
    """Every rank of every job starts the bootstrap: on a host without cards (no hl-smi, none carried) it loads
    neither the card-side steps (process/cardside.py) nor what they parse with (about a third of the bootstrap's
    start-up: issue 34); with its host's cards carried it does, and binds (the tests above)."""
    (tmp_path / "loaded.py").write_text(LOADED)
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", HOST_CARDS)}
    env.update(
        {JOB_ID: "c4a1d0e6", "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"},
        PYTHONPATH=ROOT,
        TMPDIR=str(tmp_path),
        PATH="/usr/bin:/bin",  # no hl-smi
    )
    env[DEVICE] = "cpu"

    def loaded(**extra: str) -> list[str]:
        done = subprocess.run(
            [sys.executable, "-u", "-m", "gaudi_launch.process.worker", str(tmp_path / "loaded.py")],
            capture_output=True,
            text=True,
            env={**env, **extra},
            cwd=tmp_path,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout.split("LOADED ", 1)[1].splitlines()[0])

    assert loaded() == []
    here = cards.HostCards(cards=[cards.Card(0, 0, "0000:19:00.0")], numa_of_bus={"0000:19:00.0": 0}, node_cpus={})
    with_cards = loaded(**{HOST_CARDS: gaudi.carry_cards([(socket.gethostname(), here)])})
    assert {"gaudi_launch.process.cardside", "gaudi_launch.plan.gaudi", "gaudi_launch.inputs.cards"} <= set(with_cards)
