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

from gaudi_launch.plan import fanoutmode
from gaudi_launch.process import gate
from gaudi_launch.remote import gatewire, onepass
from gaudi_launch.wire import JOB_ID, NO_PYTHON_FLAG, TREE_PASSES

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
    assert fanoutmode.one_pass_asked({TREE_PASSES: value} if value else {}) is want


def test_each_host_gets_only_its_own_cards():
    import json as j

    from gaudi_launch.wire import HOST_CARDS

    value = j.dumps({"layouts": [[[[0, 0, "b0", 0]], [[0, "0-3"]], ["n1", "n2"]], [[[1, 1, "b1", 0]], [], ["n3"]]]})
    got = onepass.per_host({HOST_CARDS: value, "HCCL_SOCKET_IFNAME": "eth0"}, {"h1": "n1", "h3": "n3", "h4": None})
    assert j.loads(got["h1"][HOST_CARDS]) == {"layouts": [[[[0, 0, "b0", 0]], [[0, "0-3"]], ["n1"]]]}
    assert j.loads(got["h3"][HOST_CARDS]) == {"layouts": [[[[1, 1, "b1", 0]], [], ["n3"]]]}
    assert got["h4"] == {"HCCL_SOCKET_IFNAME": "eth0"}
    assert all(e["HCCL_SOCKET_IFNAME"] == "eth0" for e in got.values())


# ---------------------------------------------------------------- one connection per host (issue 34)


class CountingGate(onepass.GateServer):
    """The launcher's real listener, counting the connections it took."""

    def __init__(self, plan):
        self.accepted = 0
        super().__init__(plan, bind_addr="127.0.0.1")

    def _accept(self) -> None:
        self.accepted += 1
        super()._accept()


def _host_ranks(server, tmp_path, local_ranks, program: str, job: str = "", size: int = 0) -> list[subprocess.Popen]:
    """Ranks of one host of a one-pass job (a job id, so a job directory under this test's TMPDIR), started
    together under the gate's variables; each runs ``sh -c program`` with $R its rank. A job id of its own:
    the host's last rank sweeps what carries it."""
    env = {
        **os.environ,
        "TMPDIR": str(tmp_path),
        gate.GATE: f"127.0.0.1:{server.port}",
        gate.GATE_KEY: server.key.hex(),
        gate.GATE_PROBE: json.dumps({"command": "echo probed", "master_command": "echo probed", "master_node": 0}),
        JOB_ID: job or os.urandom(4).hex(),
        "WORLD_SIZE": str(size or len(local_ranks)),
        "LOCAL_WORLD_SIZE": str(size or len(local_ranks)),
    }
    return [
        subprocess.Popen(
            [sys.executable, "-m", "gaudi_launch.process.worker", NO_PYTHON_FLAG, "/bin/sh", "-c", program],
            env={**env, "RANK": str(r), "LOCAL_RANK": str(r), "R": str(r)},
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in local_ranks
    ]


def _finish(procs) -> list[tuple[int, str]]:
    out = []
    for p in procs:
        try:
            _, err = p.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
            _, err = p.communicate()
        out.append((p.returncode, err))
    return out


def test_a_hosts_ranks_take_one_connection_and_all_get_the_verdict(tmp_path):
    from types import SimpleNamespace

    server = CountingGate(SimpleNamespace(nodes=[SimpleNamespace(host="h0", ranks=[0, 1, 2, 3])]))
    try:
        server.decide(True, {"h0": {"FROM_THE_GATE": "yes"}})
        procs = _host_ranks(server, tmp_path, [0, 1, 2, 3], f'echo "$FROM_THE_GATE" > {tmp_path}/ran-$R')
        done = _finish(procs)
        server.wait_closed(5.0)
        assert [code for code, _ in done] == [0, 0, 0, 0], done
        assert [(tmp_path / f"ran-{r}").read_text() for r in range(4)] == ["yes\n"] * 4
        # the first rank's connection, and at most one more: the host's last rank saying it swept, when that
        # is another rank (before: one per rank, 4)
        assert 1 <= server.accepted <= 2
        assert "h0" in server.swept  # the host's last rank swept it and said so
    finally:
        server.close()


def test_a_hosts_other_ranks_told_stop_exit_3_and_run_nothing(tmp_path):
    from types import SimpleNamespace

    server = CountingGate(SimpleNamespace(nodes=[SimpleNamespace(host="h0", ranks=[0, 1])]))
    try:
        server.decide(False)
        done = _finish(_host_ranks(server, tmp_path, [0, 1], f"touch {tmp_path}/ran-$R"))
        assert [code for code, _ in done] == [gatewire.STOP_EXIT] * 2, done
        assert not list(tmp_path.glob("ran-*")) and server.accepted == 1
    finally:
        server.close()


def test_a_verdict_left_without_the_key_runs_nothing(tmp_path):
    """What a host's other ranks read is checked as the first rank checks the launcher's answer: a verdict
    signed with another key (left by anyone who could write there) starts nothing."""
    from types import SimpleNamespace

    from gaudi_launch.wire import path_for

    server = CountingGate(SimpleNamespace(nodes=[SimpleNamespace(host="h0", ranks=[0, 1])]))
    try:
        job = os.urandom(4).hex()
        job_dir = path_for(job, tmp=str(tmp_path))
        os.mkdir(job_dir, 0o700)
        forged = gatewire.verdict(bytes(32), "n" * 32, True, {}).decode()
        with open(os.path.join(job_dir, gate._verdict_name()), "w") as f:
            json.dump({"nonce": "n" * 32, "line": forged.strip()}, f)
        (rank1,) = _finish(_host_ranks(server, tmp_path, [1], f"touch {tmp_path}/ran-$R", job=job))
        assert rank1[0] == 2 and "wrong answer" in rank1[1], rank1
        assert not list(tmp_path.glob("ran-*")) and server.accepted == 0
    finally:
        server.close()


def test_a_first_rank_done_before_its_hosts_other_ranks_started_leaves_them_running(tmp_path):
    """The host's sweep is its last rank's: a first rank whose script ended before another rank of its host
    reached the gate is not the last one (it does not sweep that rank away); the later rank reads the verdict
    the first one left, runs, and sweeps the host at its end."""
    from types import SimpleNamespace

    server = CountingGate(SimpleNamespace(nodes=[SimpleNamespace(host="h0", ranks=[0, 1])]))
    try:
        server.decide(True, {"h0": {}})
        job = os.urandom(4).hex()
        (first,) = _finish(_host_ranks(server, tmp_path, [0], f"touch {tmp_path}/ran-$R", job=job, size=2))
        assert first[0] == 0, first
        assert "h0" not in server.swept  # not the last: rank 1 has not started
        (later,) = _finish(_host_ranks(server, tmp_path, [1], f"sleep 0.3; touch {tmp_path}/ran-$R", job=job, size=2))
        server.wait_closed(5.0)
        assert later[0] == 0, later
        assert sorted(p.name for p in tmp_path.glob("ran-*")) == ["ran-0", "ran-1"]
        assert "h0" in server.swept and server.accepted == 2
    finally:
        server.close()


def test_the_probe_with_its_checks_in_this_interpreter_says_what_the_ssh_pre_flight_s_probe_says(tmp_path):
    """A one-pass rank runs the probe's Python checks in a fork of its own interpreter (gate.checks_here), not in
    one more started by probe.sh: the same facts, judged by the same code, as the ssh pre-flight's probe."""
    import dataclasses

    from gaudi_launch.remote import probe

    assert gate.PROBE_END == probe.END
    with socket.socket() as master:  # the master's sshd, as the checks see it: a listener
        master.bind(("127.0.0.1", 0))
        master.listen(8)
        port = master.getsockname()[1]
        common = (sys.executable, None, str(tmp_path), "127.0.0.1", port, None)

        def sh(cmd: str) -> str:
            return subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, cwd="/", timeout=120).stdout

        classic = probe.parse(sh(probe.command(*common)))
        left = probe.parse(sh(probe.command(*common, checks_by_caller=True)))
        args = {
            "command": probe.command(*common, checks_by_caller=True),
            "master_command": "exit 1",
            "master_node": 1,
            "checks": probe.checks_code(),
            "checks_argv": probe.checks_argv(str(tmp_path), None, "127.0.0.1", port, None),
        }
        ours = probe.parse(gate.probe_here(args, {"NODE_RANK": "0"}))
    assert left.complete and left.python_ok is None and left.master_reachable is None  # sh started no Python
    assert ours.complete and ours.python_ok and ours.gaudi_launch_ok and ours.master_reachable
    assert dataclasses.asdict(ours) == dataclasses.asdict(classic)
