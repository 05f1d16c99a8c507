"""The one-pass tree's gate (process/gate.py, remote/onepass.py): its messages are authenticated both ways, and
a rank that is told stop, or cannot trust what it is told, never runs the user's script."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading

import pytest

from gaudi_launch.process import gate
from gaudi_launch.remote import gatewire, onepass
from gaudi_launch.wire import NO_PYTHON_FLAG

KEY = bytes(range(32))


def test_a_hello_is_read_only_with_the_key_it_was_made_with():
    line = gatewire.hello(KEY, "3", "h1", "probe output", "n" * 32)
    body = gatewire.read_hello(KEY, line.strip())
    assert body == {"rank": "3", "host": "h1", "probe": "probe output", "nonce": "n" * 32}
    assert gatewire.read_hello(bytes(32), line.strip()) is None


def test_a_changed_hello_is_refused():
    msg = json.loads(gatewire.hello(KEY, "3", "h1", "script_ok=1", "n" * 32))
    msg["body"] = msg["body"].replace("script_ok=1", "script_ok=0")
    assert gatewire.read_hello(KEY, json.dumps(msg).encode()) is None


def test_a_verdict_is_bound_to_the_ranks_nonce():
    line = gatewire.verdict(KEY, "nonce-a", True, {"HCCL_SOCKET_IFNAME": "eth0"})
    assert gatewire.read_verdict(KEY, "nonce-a", line.strip()) == {"go": True, "env": {"HCCL_SOCKET_IFNAME": "eth0"}}
    assert gatewire.read_verdict(KEY, "nonce-b", line.strip()) is None  # replayed to another rank
    assert gatewire.read_verdict(bytes(32), "nonce-a", line.strip()) is None  # not the launcher's key


def test_mac_parts_are_length_prefixed():
    assert gatewire.mac(KEY, b"ab", b"c") != gatewire.mac(KEY, b"a", b"bc")


def _rank(environ: dict, tmp_path) -> subprocess.CompletedProcess:
    """The rank bootstrap (--no_python: a program that leaves a file) under the gate's variables."""
    ran = tmp_path / "ran"
    env = {**os.environ, **environ, "RANK": "0", "LOCAL_RANK": "1", "WORLD_SIZE": "1"}
    return subprocess.run(
        [sys.executable, "-m", "gaudi_launch.process.worker", NO_PYTHON_FLAG, "/bin/sh", "-c", f"touch {ran}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    ), ran


class Launcher:
    """A listener that answers one rank as given: go, stop, or with the wrong key."""

    def __init__(self, go: bool, key: bytes, env=None):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.hello = None

        def serve():
            conn, _ = self.sock.accept()
            with conn:
                data = b""
                while b"\n" not in data:
                    data += conn.recv(65536)
                self.hello = gatewire.read_hello(KEY, data.split(b"\n")[0])
                nonce = self.hello["nonce"] if self.hello else ""
                conn.sendall(gatewire.verdict(key, nonce, go, env or {}))
                conn.recv(1)

        self.thread = threading.Thread(target=serve, daemon=True)
        self.thread.start()

    def environ(self) -> dict:
        return {
            gate.GATE: f"127.0.0.1:{self.port}",
            gate.GATE_KEY: KEY.hex(),
            gate.GATE_PROBE: json.dumps({"command": "echo probed", "master_command": "echo probed", "master_node": 0}),
        }


def test_a_rank_told_go_runs_its_program(tmp_path):
    launcher = Launcher(True, KEY)
    res, ran = _rank(launcher.environ(), tmp_path)
    assert res.returncode == 0, res.stderr
    assert ran.exists()
    assert launcher.hello is not None and launcher.hello["rank"] == "0"


def test_a_rank_told_stop_exits_3_and_runs_nothing(tmp_path):
    launcher = Launcher(False, KEY)
    res, ran = _rank(launcher.environ(), tmp_path)
    assert res.returncode == gatewire.STOP_EXIT, res.stderr
    assert not ran.exists()


def test_a_go_without_the_key_runs_nothing(tmp_path):
    launcher = Launcher(True, bytes(32))  # someone else's answer
    res, ran = _rank(launcher.environ(), tmp_path)
    assert res.returncode == 2
    assert "wrong answer" in res.stderr
    assert not ran.exists()


def test_no_launcher_runs_nothing(tmp_path):
    s = socket.create_server(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    env = {gate.GATE: f"127.0.0.1:{port}", gate.GATE_KEY: KEY.hex(), gate.GATE_PROBE: "{}"}
    res, ran = _rank(env, tmp_path)
    assert res.returncode == 2
    assert not ran.exists()


def test_the_key_is_not_left_to_the_users_program(tmp_path):
    launcher = Launcher(True, KEY)
    out = tmp_path / "env"
    env = {**os.environ, **launcher.environ(), "RANK": "0", "LOCAL_RANK": "1", "WORLD_SIZE": "1"}
    subprocess.run(
        [sys.executable, "-m", "gaudi_launch.process.worker", NO_PYTHON_FLAG, "/bin/sh", "-c", f"env > {out}"],
        env=env,
        check=True,
        timeout=60,
    )
    assert gate.GATE_KEY not in out.read_text()


def test_held_stream_holds_until_released():
    import io

    inner = io.StringIO()
    held = onepass.HeldStream(inner)
    held.write("mpirun's box\n")
    assert inner.getvalue() == ""
    held.release(False)
    held.write("the job's output\n")
    assert inner.getvalue() == "the job's output\n"
    inner2 = io.StringIO()
    held2 = onepass.HeldStream(inner2)
    held2.write("early\n")
    held2.release(True)
    assert inner2.getvalue() == "early\n"


@pytest.mark.parametrize("value,want", [("3", False), ("1", True), ("", True)])
def test_three_passes_asked(value, want):
    assert onepass.one_pass_asked({onepass.PASSES_ENV: value} if value else {}) is want


def test_each_host_gets_only_its_own_cards():
    import json as j

    from gaudi_launch.wire import HOST_CARDS

    value = j.dumps({"layouts": [[[[0, 0, "b0", 0]], [[0, "0-3"]], ["n1", "n2"]], [[[1, 1, "b1", 0]], [], ["n3"]]]})
    got = onepass.per_host({HOST_CARDS: value, "HCCL_SOCKET_IFNAME": "eth0"}, {"h1": "n1", "h3": "n3", "h4": None})
    assert j.loads(got["h1"][HOST_CARDS]) == {"layouts": [[[[0, 0, "b0", 0]], [[0, "0-3"]], ["n1"]]]}
    assert j.loads(got["h3"][HOST_CARDS]) == {"layouts": [[[[1, 1, "b1", 0]], [], ["n3"]]]}
    assert got["h4"] == {"HCCL_SOCKET_IFNAME": "eth0"}
    assert all(e["HCCL_SOCKET_IFNAME"] == "eth0" for e in got.values())
