"""Notice a host that vanishes mid-run (its sshd and its link gone) and say which one.

A rank blocked in a collective on a dead peer can wait for many minutes, and mpirun or pdsh may
never notice; so while a multi-host job runs, every remote host's SSH port is probed now and then.
A host that misses several probes in a row is reported once, and the supervisor tears the job down.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from typing import Callable, Optional, Union

from gaudi_launch.inputs.hostnames import split_user
from gaudi_launch.inputs.sshconfig import SshConfigError
from gaudi_launch.remote.fanout import per_host
from gaudi_launch.remote.sshresolve import SshOptions, resolve

Endpoint = tuple[str, str, int]  # (name as in the hostfile, address to probe, port)


def ssh_endpoints(hosts: Sequence[str], port: Optional[int], config_path: Optional[str]) -> list[Endpoint]:
    """Where each host's sshd listens, as ssh itself would connect (HostName/Port from the ssh config,
    inputs/sshconfig.py). A config that cannot be read (the pre-flight says why) leaves the names as given."""
    try:
        found = resolve(hosts, SshOptions(port=port, config=config_path))
    except (SshConfigError, RuntimeError):
        found = {}
    return [(h, found[h].hostname, found[h].port) if h in found else (h, split_user(h)[1], port or 22) for h in hosts]


def reachable(addr: str, port: int, timeout: float) -> bool:
    try:
        with socket.create_connection((addr, port), timeout=timeout):
            return True
    except OSError as exc:
        # Refused means the machine answered: it is there, only sshd is not (yet another problem).
        return isinstance(exc, ConnectionRefusedError)


class HostWatch:
    def __init__(
        self,
        endpoints: Union[Sequence[Endpoint], Callable[[], Sequence[Endpoint]]],
        *,
        timeout: float = 2.0,
        misses: int = 3,
    ):
        # A callable is resolved at the first probe (a host whose config only ssh -G can evaluate costs
        # a process: a job that ends before the first probe never pays it).
        self._resolve = endpoints if callable(endpoints) else None
        self.endpoints: list[Endpoint] = [] if callable(endpoints) else list(endpoints)
        self.timeout = timeout
        self.misses = misses
        self.missed: dict[str, int] = {h: 0 for h, _, _ in self.endpoints}
        self.lost: set = set()

    def probe(self) -> Optional[str]:
        """One round over every host at once; a message for a host that is now lost, else None."""
        if self._resolve is not None:
            self.endpoints, self._resolve = list(self._resolve()), None
            self.missed = {h: 0 for h, _, _ in self.endpoints}
        where = {h: (addr, port) for h, addr, port in self.endpoints if h not in self.lost}
        results = per_host(
            list(where),
            lambda h: reachable(*where[h], self.timeout),
            timeout=self.timeout + 2,
            default=lambda _: False,
            name="watch",
        )
        for host, addr, port in self.endpoints:
            if host in self.lost:
                continue
            self.missed[host] = 0 if results.get(host) else self.missed[host] + 1
            if self.missed[host] >= self.misses:
                self.lost.add(host)
                return (
                    f"host {host} stopped answering: no reply from {addr}:{port} in {self.misses} probes "
                    "(powered off, network cut, or sshd gone)"
                )
        return None
