"""Ranks where the plan put them (process/placement.py): the machines the ranks report must split them as
the plan's hosts do, whatever names the hostfile used."""

from __future__ import annotations

from gaudi_launch.process.placement import machine, misplaced
from gaudi_launch.process.worker import route_source


def test_the_plans_split_passes_whatever_the_hostfile_called_the_hosts():
    planned = {0: "10.0.0.1", 1: "10.0.0.1", 2: "node-b", 3: "node-b"}
    assert misplaced(planned, {0: "a", 1: "a", 2: "b", 3: "b"}) is None
    assert misplaced(planned, {0: "a", 1: "a", 2: "a"}) is None  # rank 3 has not said yet


def test_ranks_all_on_one_node_show_both_lists():
    planned = {0: "node-a", 1: "node-a", 2: "node-b", 3: "node-b"}
    text = misplaced(planned, {0: "a", 1: "a", 2: "a", 3: "a"})
    assert "planned ranks 0-1 on node-a; ranks 2-3 on node-b; they reported ranks 0-3 on a" in text
    # one planned host's ranks on two machines is as wrong
    assert "rank 1 on b" in misplaced({0: "x", 1: "x"}, {0: "a", 1: "b"})


def test_two_machines_sharing_a_hostname_are_two_machines_and_one_machine_is_still_caught():
    # cloned images: both hosts call themselves "ubuntu"; the address each reaches the master from differs
    planned = {0: "node-a", 1: "node-a", 2: "node-b", 3: "node-b"}
    a, b = machine("ubuntu", "10.0.0.1"), machine("ubuntu", "10.0.0.2")
    assert misplaced(planned, {0: a, 1: a, 2: b, 3: b}) is None
    text = misplaced(planned, {0: a, 1: a, 2: a, 3: a})
    assert "they reported ranks 0-3 on ubuntu (10.0.0.1)" in text
    assert machine("n1", "") == "n1"  # no route to the master: the hostname alone, as before


def test_a_rank_tells_the_address_it_reaches_the_master_from():
    assert route_source("127.0.0.1") == "127.0.0.1"
    assert route_source("") == ""
