"""Two hostfile names that reach one machine (an ssh alias, a HostName in the ssh config, a second DNS name).

The ranks' own placement check (process/placement.py) sees this only once every rank has started, and under
mpirun they may never start: both names get an orted in the same session directory
(/tmp/ompi.HOSTNAME.UID/jf.N, shared hwloc.sm), one of them dies after `--daemonize` has detached it from
its ssh, and mpirun waits for its call-back for ever (seen on the namespace cluster, OpenMPI 4.1.4). The
pre-flight already read each host's hostname and addresses, so it names the pair before anything starts.

A machine is its hostname AND its global addresses: cloned images share a hostname but not an address;
docker0, virbr0, veth and link-local addresses repeat across machines and are left out. Pure.
"""

from __future__ import annotations

import ipaddress
from typing import Optional

from gaudi_launch.plan.fabric import VIRTUAL_PREFIXES, parse_ip_addr


def identity(hostname: Optional[str], ip_addr: str) -> Optional[tuple[str, frozenset]]:
    """(hostname, its global addresses), or None when either is unknown."""
    if not hostname:
        return None
    addresses = set()
    for iface in parse_ip_addr(ip_addr or ""):
        if iface.name.startswith(VIRTUAL_PREFIXES):
            continue
        for cidr in iface.addresses:
            ip = ipaddress.ip_interface(cidr).ip
            if not (ip.is_loopback or ip.is_link_local):
                addresses.add(str(ip))
    return (hostname, frozenset(addresses)) if addresses else None


def same_machines(facts: dict) -> dict[str, str]:
    """{host: the earlier host it is the same machine as}, in the hosts' order (preflight.HostFacts values)."""
    first: dict[tuple, str] = {}
    out = {}
    for host, f in facts.items():
        key = identity(f.hostname, f.ip_addr) if f.ok else None
        if key is None:
            continue
        if key in first:
            out[host] = first[key]
        else:
            first[key] = host
    return out


def judge(report) -> None:
    """Fail each host that is a machine an earlier host already is (a preflight.CheckReport, in place)."""
    for host, earlier in same_machines(report.facts).items():
        f = report.facts[host]
        hostname, addresses = identity(f.hostname, f.ip_addr) or ("", frozenset())
        f.ok = False
        f.reason = (
            f"the same machine as {earlier} (hostname {hostname}, address {', '.join(sorted(addresses))}): "
            "the job would put two hosts' ranks on one machine's cards"
        )
        f.fix = (
            "name each machine once in the hostfile (an ssh alias or a HostName in the ssh config sends both "
            "names there)"
        )
