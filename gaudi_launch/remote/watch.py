"""Notice a host that vanishes mid-run (its sshd and its link gone) and say which one.

A rank blocked in a collective on a dead peer can wait for many minutes, and mpirun or pdsh may
never notice; so while a multi-host job runs, every remote host's SSH port is probed now and then.
A host that misses several probes in a row is reported once, and the supervisor tears the job down.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Sequence
from typing import Callable, Optional, Union

Endpoint = tuple[str, str, int]  # (name as in the hostfile, address to probe, port)


def ssh_endpoints(hosts: Sequence[str], port: Optional[int], config_path: Optional[str]) -> list[Endpoint]:
    """Where each host's sshd listens, as ssh itself would connect (HostName/Port from ssh_config)."""
    path = os.path.expanduser(config_path or "~/.ssh/config")
    config = None
    if os.path.isfile(path):
        import paramiko  # only for multi-host runs

        try:
            config = paramiko.SSHConfig.from_path(path)
        except Exception:
            config = None
    out = []
    for host in hosts:
        name = host.rsplit("@", 1)[-1].strip("[]")
        conf = {}
        if config is not None:
            try:
                conf = config.lookup(name)
            except Exception:
                conf = {}
        try:
            p = port or int(conf.get("port", 22))
        except ValueError:
            p = 22
        out.append((host, conf.get("hostname", name), p))
    return out


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
        # A callable is resolved at the first probe (reading the ssh config takes paramiko, a tenth
        # of a second or more: a job that ends before the first probe never pays it).
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
        results: dict[str, bool] = {}

        def one(host: str, addr: str, port: int) -> None:
            results[host] = reachable(addr, port, self.timeout)

        threads = [threading.Thread(target=one, args=e, daemon=True) for e in self.endpoints if e[0] not in self.lost]
        for t in threads:
            t.start()
        for t in threads:
            t.join(self.timeout + 2)
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
