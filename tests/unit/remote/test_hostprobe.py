"""This machine's facts (remote/hostprobe.py): the pre-flight's own probe run here as a local process, in its
one-host form, read into the same HostFacts the SSH pre-flight gives; the planner plans the local backend's
job, and an ssh backend's hosts that are this machine without a pre-flight, from them. The Gaudi cards come
from the hl-smi stand-in (tests/standin/bin)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from gaudi_launch.backends import get_backend
from gaudi_launch.errors import UserError
from gaudi_launch.inputs.spec import JobSpec
from gaudi_launch.plan.hostfacts import HostFacts
from gaudi_launch.plan.planner import build_plan
from gaudi_launch.remote import probe
from gaudi_launch.remote.hostprobe import probe_here
from gaudi_launch.remote.preflight import SshOptions, check_hosts

STANDIN_BIN = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "standin", "bin"))


@pytest.fixture
def gaudi2_here(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", STANDIN_BIN + os.pathsep + os.environ["PATH"])
    monkeypatch.setenv("GAUDI_STANDIN_CARDS", "gaudi2")
    monkeypatch.delenv("HABANA_VISIBLE_MODULES", raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("")


def check_this_host(tmp_path, **more):
    """The pre-flight of this machine alone as "localhost", all 8 cards, train.py in ``tmp_path``."""
    return check_hosts(
        ["localhost"],
        python=sys.executable,
        script="train.py",
        cwd=str(tmp_path),
        master_host="localhost",
        master_addr="127.0.0.1",
        master_port=None,
        devices_needed={"localhost": 8},
        ssh=SshOptions(),
        local=lambda host: True,
        **more,
    )


def test_this_machine_read_by_the_probe_every_host_gets(gaudi2_here, tmp_path):
    facts = probe_here("localhost", sys.executable, "train.py", str(tmp_path))
    assert isinstance(facts, HostFacts) and facts.host == "localhost"
    assert facts.hostname == socket.gethostname() and facts.ncpus == os.cpu_count()
    assert facts.script_ok is True and facts.cwd_ok is True and facts.cwd == str(tmp_path)
    assert facts.devices == 8 and len(facts.cards.cards) == 8  # hl-smi's cards, by module id
    assert facts.one_host and facts.fabric.generation == 2  # the generation, but no scale-out path from it
    assert facts.fabric.ports_up is None and facts.fabric.ofi_wrapper is None  # (links and libfabric not read)
    assert facts.python_ok is None and facts.deepspeed is None  # one host: no Python started, no versions
    assert probe_here("localhost", sys.executable, "missing.py", str(tmp_path)).script_ok is False


def test_the_pre_flight_reads_the_same_facts_of_this_host(gaudi2_here, tmp_path):
    """Whichever way the probe ran, what both read of the host is the same object with the same values."""
    here = probe_here("localhost", sys.executable, "train.py", str(tmp_path))
    checked = check_this_host(tmp_path).facts["localhost"]
    assert type(checked) is HostFacts
    for name in (
        "hostname",
        "ncpus",
        "devices",
        "cwd",
        "cwd_ok",
        "script_ok",
        "cards",
    ):  # (not ip_addr: other tests add links)
        assert getattr(here, name) == getattr(checked, name), name
    assert checked.fabric.generation == 2  # the pre-flight also reads the scale-out links


def test_a_one_pass_job_judges_this_host_by_its_own_rank_s_probe_and_runs_none_here(gaudi2_here, tmp_path, monkeypatch):
    """In one pass (remote/onepass.py) this host's first rank probes it as every host's does: the pre-flight takes
    that output for this machine too, and runs no probe of its own between the last answer and the go."""
    from gaudi_launch.remote import preflight, treeprobe

    line = probe.command(sys.executable, "train.py", str(tmp_path), "127.0.0.1", 0, None)
    rank_said = subprocess.run(["sh", "-c", line], capture_output=True, text=True, timeout=60).stdout
    ran_here = []
    monkeypatch.setattr(preflight, "_local_run", lambda cmd: ran_here.append(cmd) or ("", "", 1))
    given = treeprobe.TreeResult(outputs={"localhost": rank_said})
    facts = check_this_host(tmp_path, tree=lambda port: given).facts["localhost"]
    assert ran_here == [] and facts.ok and facts.devices == 8 and facts.script_ok is True
    check_this_host(tmp_path)  # without the rank's output: probed here, as before
    assert len(ran_here) == 1


def test_the_one_host_probe_starts_no_python_and_reads_no_links(gaudi2_here, tmp_path):
    line = probe.command(sys.executable, None, str(tmp_path), "127.0.0.1", 0, None, one_host=True)
    out = subprocess.run(["sh", "-c", line], capture_output=True, text=True, timeout=60).stdout
    assert probe.END in out and "python_ok" not in out
    assert "@@hl-smi -n link" not in out and "@@hl-smi --fw-versions" not in out
    assert "@@hl-smi -Q index,module_id,bus_id -f csv,noheader" in out  # the cards, for binding and partial nodes
    full = probe.command(sys.executable, None, str(tmp_path), "127.0.0.1", 0, None)
    out = subprocess.run(["sh", "-c", full], capture_output=True, text=True, timeout=60).stdout
    assert "@@hl-smi -n link" in out and "python_ok=1" in out and "master_reachable" not in out  # port 0: no connect
    assert "master_ip=127.0.0.1" in out


def test_a_local_partial_node_is_refused_whatever_the_backend_without_a_pre_flight(gaudi2_here, tmp_path):
    (tmp_path / "hosts").write_text("localhost slots=8\n")
    for backend, more in (("local", {}), ("mpirun", {"hostfile": "hosts", "ssh_check": False})):
        with pytest.raises(UserError, match="module ids 0,3"):
            build_plan(
                JobSpec(program=["train.py"], include="localhost:0,3", backend=backend, **more), backends=get_backend
            )


def test_a_one_host_job_takes_this_machines_fabric_from_its_facts(tmp_path, monkeypatch):
    """First-generation Gaudi with EFA (the stand-in's DL1): the local backend's plan takes the generation and the
    EFA devices from this machine's facts, and reads the host no other way (fabric.efa_present and
    local_generation, its former reads, fail here if called)."""
    from gaudi_launch.plan import fabric
    from tests.standin import gaudi_tools

    gaudi_tools.apply(monkeypatch, "dl1", root=tmp_path / "host")
    monkeypatch.chdir(tmp_path)
    for name in [n for n in os.environ if n.startswith(("HCCL_", "HABANA_"))]:
        monkeypatch.delenv(name)
    monkeypatch.setattr(fabric, "efa_present", lambda *a, **k: pytest.fail("read this host again"))
    monkeypatch.setattr(fabric, "local_generation", lambda *a, **k: pytest.fail("read this host again"))
    plan = build_plan(JobSpec(program=["train.py"], num_devices=2, backend="local"), backends=get_backend)
    assert plan.env["HCCL_OVER_OFI"] == "1"  # DL1's recipe: EFA devices and first-generation Gaudi, from the facts
    plan = build_plan(JobSpec(program=["train.py"], num_devices=2, backend="local", efa=False), backends=get_backend)
    assert "HCCL_OVER_OFI" not in plan.env
