"""Two hostfile names of one machine fail the pre-flight; cloned hostnames on two machines do not."""

from gaudi_launch.remote import samemachine
from gaudi_launch.remote.preflight import CheckReport, HostFacts


def _ip(*lines: str) -> str:
    return "\n".join(lines) + "\n"


LO = "1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever preferred_lft forever"
DOCKER = "3: docker0    inet 172.17.0.1/16 brd 172.17.255.255 scope global docker0\\       valid_lft forever"
LINK_LOCAL = "2: eth0    inet6 fe80::1/64 scope link \\       valid_lft forever preferred_lft forever"


def eth0(addr: str) -> str:
    return f"2: eth0    inet {addr}/24 brd 10.1.0.255 scope global eth0\\       valid_lft forever preferred_lft forever"


def facts(host: str, hostname: str, *ip_lines: str, ok: bool = True) -> HostFacts:
    return HostFacts(host=host, ok=ok, hostname=hostname, ip_addr=_ip(*ip_lines))


def report(*fs: HostFacts) -> CheckReport:
    return CheckReport(facts={f.host: f for f in fs}, warnings=[])


def test_an_alias_of_a_machine_fails_naming_the_first_name_and_what_to_do():
    r = report(
        facts("n1", "node1", LO, eth0("10.1.0.11"), DOCKER),
        facts("n2", "node2", LO, eth0("10.1.0.12"), DOCKER),
        facts("alias", "node1", LO, eth0("10.1.0.11"), DOCKER),
    )
    samemachine.judge(r)
    assert [h for h, f in r.facts.items() if not f.ok] == ["alias"]
    assert r.facts["alias"].reason.startswith("the same machine as n1 (hostname node1, address 10.1.0.11)")
    assert "name each machine once in the hostfile" in r.facts["alias"].fix


def test_cloned_hostnames_on_different_addresses_are_two_machines():
    r = report(facts("a", "clone", LO, eth0("10.1.0.11"), DOCKER), facts("b", "clone", LO, eth0("10.1.0.12"), DOCKER))
    samemachine.judge(r)
    assert all(f.ok for f in r.facts.values())


def test_addresses_every_machine_has_alike_do_not_make_one_machine():
    # the same hostname and only loopback, docker0 and link-local addresses in common: not judged
    r = report(facts("a", "clone", LO, DOCKER, LINK_LOCAL), facts("b", "clone", LO, DOCKER, LINK_LOCAL))
    samemachine.judge(r)
    assert all(f.ok for f in r.facts.values())


def test_a_failed_or_unknown_host_is_not_compared():
    r = report(
        facts("a", "node1", eth0("10.1.0.11")),
        facts("b", "node1", eth0("10.1.0.11"), ok=False),
        facts("c", "", eth0("10.1.0.11")),
    )
    assert samemachine.same_machines(r.facts) == {}
