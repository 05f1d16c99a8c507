"""Cards by module id, Habana's partial nodes, busy cards and NUMA binding (inputs/cards.py), read from the hl-smi
stand-in (tests/standin/bin/hl-smi) for Gaudi 2, Gaudi 3 and DL1."""

import os
import subprocess

import pytest

from gaudi_launch.inputs import cards
from gaudi_launch.inputs.idranges import id_ranges

HL_SMI = os.path.join(os.path.dirname(__file__), "..", "..", "standin", "bin", "hl-smi")


def hl_smi(*args: str, profile: str = "gaudi2", busy: str = "") -> str:
    env = {**os.environ, "GAUDI_STANDIN_CARDS": profile, "GAUDI_STANDIN_HL_SMI_BUSY": busy}
    return subprocess.run([HL_SMI, *args], capture_output=True, text=True, env=env, check=True).stdout


@pytest.mark.parametrize("profile, name", [("gaudi2", "HL-225"), ("gaudi3", "HL-325L"), ("dl1", "HL-205")])
def test_query_reads_module_ids_not_indices(profile, name):
    got = cards.parse_query(hl_smi("-Q", "index,module_id,bus_id", "-f", "csv", profile=profile))
    assert len(got) == 8  # the header line is skipped
    by_index = {c.index: c.module_id for c in got}
    assert by_index[0] == 5 and by_index[6] == 0  # "Multiple Dockers Each with a Single Workload"'s sample
    assert sorted(by_index.values()) == list(range(8))
    assert hl_smi("-Q", "name", "-f", "csv,noheader", profile=profile).split()[0] == name


def test_processes_name_the_holder_of_a_card():
    summary = hl_smi(busy="5:4242:python3")
    assert cards.parse_processes(summary) == {5: [("4242", "python3")]}
    assert cards.parse_processes(hl_smi()) == {}  # idle cards read N/A
    host = cards.HostCards(cards=cards.parse_query(hl_smi("-Q", "index,module_id,bus_id", "-f", "csv")))
    host.holders = cards.parse_processes(summary)
    # index 5 is module 3: asking for modules 2,3 finds it, 0,1 does not; our own pid is not a finding
    assert cards.held_cards([2, 3], host, {}) == ["card module 3 (index 5) is held by process 4242 (python3)"]
    assert cards.held_cards([0, 1], host, {}) == []
    assert cards.held_cards([3], host, {"4242": True}) == []


def test_processes_read_the_real_row_of_a_held_card():
    """hl-smi's row for a held card, as published (ray-project/ray's Intel Gaudi Serve tutorial): wider than the
    table, no closing bar. An idle card's row (N/A) names nobody."""
    summary = "\n".join(
        [
            "| Compute Processes:                                               AIP Memory |",
            "|  AIP       PID   Type   Process name                             Usage      |",
            "|=============================================================================|",
            "|   6        N/A   N/A    N/A                                      N/A        |",
            "|   7       107684     C   ray::_RayTrainW                         16770MiB    ",
            "+=============================================================================+",
        ]
    )
    assert cards.parse_processes(summary) == {7: [("107684", "ray::_RayTrainW")]}


@pytest.mark.parametrize("modules", [[0, 1], [6, 7], [0, 1, 2, 3], [4, 5, 6, 7], [3], list(range(8))])
def test_supported_partial_nodes(modules):
    assert cards.partial_node_problem(modules, 8) is None


@pytest.mark.parametrize("modules", [[0, 3], [1, 2], [0, 1, 2], [2, 3, 4, 5], [0, 1, 2, 3, 4, 5]])
def test_unsupported_partial_nodes_are_named(modules):
    problem = cards.partial_node_problem(modules, 8)
    assert problem and ",".join(map(str, modules)) in problem and "0,1 / 2,3 / 4,5 / 6,7" in problem


def test_rank_modules_follow_habana_visible_modules():
    assert cards.rank_modules(4, None) == [0, 1, 2, 3]
    assert cards.rank_modules(2, "4,5") == [4, 5]
    assert cards.rank_modules(2, "6,7,") == [6, 7]


def test_cpulist():
    assert cards.parse_cpulist("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert id_ranges([3, 0, 1, 2, 8]) == "0-3,8" and id_ranges([2, 2, 1]) == "1-2" and id_ranges([]) == ""


def two_sockets(profile: str, per_socket: int) -> cards.HostCards:
    """An 8-card server with 2 sockets and hyperthreading: modules 0-3 on NUMA node 0, 4-7 on node 1 (Linux
    numbers the hyperthreads of cores 0..2n-1 as 2n..4n-1)."""
    host = cards.HostCards(
        cards=cards.parse_query(hl_smi("-Q", "index,module_id,bus_id", "-f", "csv", profile=profile))
    )
    host.numa_of_bus = {c.bus_id: 0 if c.module_id < 4 else 1 for c in host.cards}
    n = per_socket
    host.node_cpus = {
        0: list(range(0, n)) + list(range(2 * n, 3 * n)),
        1: list(range(n, 2 * n)) + list(range(3 * n, 4 * n)),
    }
    return host


@pytest.mark.parametrize("profile, per_socket", [("gaudi2", 40), ("gaudi3", 72)])
def test_eight_ranks_get_disjoint_cores_with_their_siblings_on_their_cards_node(profile, per_socket):
    host = two_sockets(profile, per_socket)
    got = cards.rank_cores(list(range(8)), host)
    share = per_socket // 4
    assert got[0] == list(range(0, share)) + list(range(2 * per_socket, 2 * per_socket + share))
    assert got[4] == list(range(per_socket, per_socket + share)) + list(range(3 * per_socket, 3 * per_socket + share))
    node0 = set(host.node_cpus[0])
    assert all(set(c) <= node0 for c in got[:4]) and all(not set(c) & node0 for c in got[4:])
    flat = [x for c in got for x in c]
    assert len(flat) == len(set(flat)) == 8 * 2 * share  # disjoint, PE=share cores (with siblings) each


def test_partial_node_shares_only_among_its_own_ranks():
    host = two_sockets("gaudi2", 40)
    got = cards.rank_cores([4, 5], host)  # HABANA_VISIBLE_MODULES=4,5: both on node 1, half of it each
    assert got[0] == list(range(40, 60)) + list(range(120, 140))
    assert got[1] == list(range(60, 80)) + list(range(140, 160))


def test_unknown_numa_node_leaves_the_rank_unbound():
    host = two_sockets("dl1", 24)
    host.numa_of_bus = {c.bus_id: -1 for c in host.cards}  # a VM without NUMA facts (DL1 on some kernels)
    assert cards.rank_cores([0, 1], host) == [None, None]


def test_read_host_from_hl_smi_and_sysfs(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", os.path.dirname(HL_SMI) + os.pathsep + os.environ["PATH"])
    monkeypatch.setenv("GAUDI_STANDIN_CARDS", "gaudi3")
    monkeypatch.setenv("GAUDI_STANDIN_HL_SMI_BUSY", "2:777:train.py")
    for c in cards.parse_query(hl_smi("-Q", "index,module_id,bus_id", "-f", "csv", profile="gaudi3")):
        d = tmp_path / "bus" / "pci" / "devices" / c.bus_id
        d.mkdir(parents=True)
        (d / "numa_node").write_text(f"{c.index // 4}\n")
    for node, cpus in ((0, "0-3,8-11"), (1, "4-7,12-15")):
        d = tmp_path / "devices" / "system" / "node" / f"node{node}"
        d.mkdir(parents=True)
        (d / "cpulist").write_text(cpus + "\n")
    host = cards.read_host(sysfs=str(tmp_path), processes=True)
    assert [c.module_id for c in host.cards] == [5, 4, 7, 6, 2, 3, 0, 1]
    assert host.node_cpus == {0: [0, 1, 2, 3, 8, 9, 10, 11], 1: [4, 5, 6, 7, 12, 13, 14, 15]}
    assert host.holders == {2: [("777", "train.py")]}
    # module 5 is index 0 (node 0), module 0 is index 6 (node 1): by module id, not by index
    assert cards.rank_cores([5, 0], host) == [[0, 1, 2, 3, 8, 9, 10, 11], [4, 5, 6, 7, 12, 13, 14, 15]]
