"""--wait-hosts: the bounded wait for every host's sshd, on real sockets and a simulated clock."""

from __future__ import annotations

import socket
import threading

import pytest

from gaudi_launch.exitcodes import ExitCode
from gaudi_launch.remote.hostwait import HostsUnreachable, probe_ssh, wait_for


def serve_once(payload: bytes) -> int:
    """A listener on 127.0.0.1 that sends ``payload`` to each client; returns its port."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)

    def loop():
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            with conn:
                if payload:
                    conn.sendall(payload)

    threading.Thread(target=loop, daemon=True).start()
    return srv.getsockname()[1]


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_probe_tells_sshd_from_other_answers():
    assert probe_ssh("127.0.0.1", serve_once(b"SSH-2.0-OpenSSH_9.2\r\n")) is None
    assert "not with an SSH banner" in probe_ssh("127.0.0.1", serve_once(b"HTTP/1.1 400\r\n"))
    assert "without an SSH banner" in probe_ssh("127.0.0.1", serve_once(b""))
    assert "refused" in probe_ssh("127.0.0.1", free_port())


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t

    def sleep(self, s):
        self.t += s


def test_waits_until_a_late_host_answers():
    clock, lines = Clock(), []
    up_at = {"a": 0.0, "b": 3.0}
    wait_for(
        [("a", "10.0.0.1", 22), ("b", "10.0.0.2", 3022)],
        30,
        probe=lambda addr, port: None if clock.t >= up_at["a" if addr.endswith("1") else "b"] else "refused",
        log=lines.append,
        clock=clock,
        sleep=clock.sleep,
    )
    assert "  a:22 answers (after 0 s)" in lines
    assert "  b:3022 answers (after 3 s)" in lines
    assert "  waiting for b:3022: refused (30 s left)" in lines
    assert clock.t == 3.0


def test_names_the_silent_host_and_why_after_the_deadline():
    clock, lines = Clock(), []
    with pytest.raises(HostsUnreachable) as err:
        wait_for(
            [("a", "10.0.0.1", 22), ("b", "10.0.0.2", 22)],
            4,
            probe=lambda addr, port: None if addr.endswith("1") else "timed out",
            log=lines.append,
            clock=clock,
            sleep=clock.sleep,
        )
    assert err.value.exit_code == ExitCode.PREFLIGHT == 3
    assert "unreachable host(s) after waiting 4 s: b" in str(err.value) and "--wait-hosts" in str(err.value)
    assert "  b:22 did not answer within 4 s (timed out)" in lines
    assert clock.t == 4.0  # bounded: never sleeps past the deadline
