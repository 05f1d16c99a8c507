"""``--wait-hosts S``: wait until every selected host's sshd answers, then run the pre-flight.

For clusters whose hosts come up with the job (containers started on every node at once: the
leader must not fail because a worker's sshd is a second late). Each host is probed in parallel
for an SSH banner; progress goes to stderr; hosts still silent after S seconds are named with why
(refused, timed out, no banner), and nothing is started (exit 3, as a failed pre-flight).
"""

from __future__ import annotations

import socket
import sys
import time
from collections.abc import Sequence
from typing import Callable, Optional

from gaudi_launch.errors import UserError
from gaudi_launch.exitcodes import ExitCode
from gaudi_launch.inputs.hostnames import is_local_host
from gaudi_launch.remote.fanout import per_host
from gaudi_launch.remote.watch import Endpoint, ssh_endpoints

REPORT_EVERY = 5.0  # seconds between "still waiting" lines


class HostsUnreachable(UserError):
    exit_code = ExitCode.PREFLIGHT


def probe_ssh(addr: str, port: int, timeout: float = 2.0) -> Optional[str]:
    """None when an SSH server answers at addr:port (its banner), else why not, in a few words."""
    try:
        with socket.create_connection((addr, port), timeout=timeout) as s:
            s.settimeout(timeout)
            banner = s.recv(64)
            if banner.startswith(b"SSH-"):
                s.sendall(b"SSH-2.0-gaudi-launch-probe\r\n")  # sshd logs a client that says nothing
    except ConnectionRefusedError:
        return "connection refused (no sshd listening yet?)"
    except socket.timeout:
        return "timed out"
    except socket.gaierror as exc:
        return f"name not resolved ({exc.strerror or exc})"
    except OSError as exc:
        return exc.strerror or str(exc)
    if banner.startswith(b"SSH-"):
        return None
    return "answers, but not with an SSH banner" if banner else "connection closed without an SSH banner"


def wait_for(
    endpoints: Sequence[Endpoint],
    seconds: float,
    *,
    probe: Callable = probe_ssh,
    log: Callable[[str], None] = lambda line: print(f"gaudi-launch: {line}", file=sys.stderr, flush=True),
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Return once every endpoint answers; raise HostsUnreachable naming the silent ones after ``seconds``."""
    start = clock()
    deadline = start + seconds
    pending: list[Endpoint] = list(endpoints)
    why: dict[str, str] = {}
    last_report = None
    log(f"waiting up to {seconds:g} s for {len(pending)} host(s) to answer on their SSH port")
    while pending:
        where = {host: (addr, port) for host, addr, port in pending}
        answers = per_host(list(where), lambda h: probe(*where[h]), name="wait-hosts")
        still = []
        for host, addr, port in pending:
            if answers[host] is None:
                log(f"  {host}:{port} answers (after {clock() - start:.0f} s)")
            else:
                why[host] = answers[host]
                still.append((host, addr, port))
        pending = still
        if not pending:
            return
        now = clock()
        if now >= deadline:
            for host, _, port in pending:
                log(f"  {host}:{port} did not answer within {seconds:g} s ({why[host]})")
            raise HostsUnreachable(
                f"unreachable host(s) after waiting {seconds:g} s: " + ", ".join(h for h, _, _ in pending),
                where="--wait-hosts",
                hint="is sshd running there (container started, the right --ssh-port) and does the "
                "network allow it? Wait longer with a larger --wait-hosts",
            )
        if last_report is None or now - last_report >= REPORT_EVERY:
            last_report = now
            for host, _, port in pending:
                log(f"  waiting for {host}:{port}: {why[host]} ({deadline - now:.0f} s left)")
        sleep(min(1.0, max(0.0, deadline - now)))


def before(preflight: Callable, seconds: float) -> Callable:
    """The pre-flight, preceded by waiting for the plan's remote hosts (the same ssh endpoints)."""

    def run(plan, spec):
        hosts = [n.host for n in plan.nodes if not is_local_host(n.host)]
        wait_for(ssh_endpoints(hosts, spec.ssh_port, spec.ssh_config), seconds)
        return preflight(plan, spec)

    return run


if __name__ == "__main__":  # `python -m gaudi_launch.remote.hostwait ADDR PORT`: the container's health probe
    why = probe_ssh(sys.argv[1], int(sys.argv[2]))
    if why:
        print(why)
    sys.exit(1 if why else 0)
