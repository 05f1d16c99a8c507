"""What torchrun, DeepSpeed and accelerate users expect at the terminal, through the real CLI."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
import time

import pytest

from gaudi_launch import __version__

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def gl(*args, cwd, timeout=120):
    return subprocess.run(
        [sys.executable, "-m", "gaudi_launch", *args], capture_output=True, text=True, cwd=str(cwd), timeout=timeout
    )


PROGRESS = """
import os, sys, time
sys.stdout.write("\\rstep 1/2"); sys.stdout.flush()
while not os.path.exists(sys.argv[1]):
    time.sleep(0.05)
sys.stdout.write("\\rstep 2/2\\n"); sys.stdout.write("done\\n"); sys.stdout.flush()
"""


def test_progress_bars_reach_a_terminal_live_and_logs_keep_the_last_state(tmp_path):
    script, go = tmp_path / "bar.py", tmp_path / "go"
    script.write_text(PROGRESS)
    pid, fd = pty.fork()
    if pid == 0:  # the launcher on a terminal, as a person runs it
        os.chdir(tmp_path)
        os.execv(
            sys.executable,
            [sys.executable, "-m", "gaudi_launch", "--num_devices", "1", "--log-dir", "logs", str(script), str(go)],
        )
    seen, deadline = b"", time.monotonic() + 120
    try:
        while b"step 1/2" not in seen:  # before the line ends: it would never come if not live
            assert time.monotonic() < deadline, seen
            if select.select([fd], [], [], 1)[0]:
                seen += os.read(fd, 4096)
        assert b"\r[rank 0] step 1/2" in seen.replace(b"\x1b[0m", b"").replace(b"\x1b[36m", b"")
        go.write_text("")
        while True:
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
    finally:
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert (tmp_path / "logs" / "rank-0.log").read_text() == "step 2/2\ndone\n"


RANKS = """
import os
print(f"hello from {os.environ['RANK']}", flush=True)
"""


def test_console_shows_only_the_chosen_ranks_and_logs_keep_all(tmp_path):
    (tmp_path / "r.py").write_text(RANKS)
    res = gl("--num_devices", "2", "--local-ranks-filter", "1", "--log-dir", "logs", "r.py", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "[rank 1] hello from 1" in res.stdout and "hello from 0" not in res.stdout
    assert (tmp_path / "logs" / "rank-0.log").read_text() == "hello from 0\n"
    assert gl("--num_devices", "2", "--ranks", "0,x", "r.py", cwd=tmp_path).returncode == 2


@pytest.mark.parametrize(
    "option, value, hint",
    [
        ("--num_processes", "8", "--num_devices N"),
        ("--num_machines", "2", "--num_nodes N with --hostfile H"),
        ("--machine_rank", "0", "starts every node itself"),
        ("--main_process_port", "29500", "--master_port"),
        ("--mixed_precision", "bf16", "pass --bf16 to the script"),
        ("--gpu_ids", "0,1", "HABANA_VISIBLE_MODULES"),
    ],
)
def test_accelerate_launch_spellings_get_ours(tmp_path, option, value, hint):
    res = gl(option, value, "t.py", cwd=tmp_path)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    first = res.stderr.splitlines()[0]
    assert first.startswith(f"gaudi-launch: error: {option}: ") and first.count(option) == 1, first
    assert hint in res.stderr, res.stderr


def test_torchrun_spellings_paste_in(tmp_path):
    res = gl("--nproc-per-node", "2", "--nnodes", "1", "--standalone", "--dry-run", "--json", "t.py", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["world_size"] == 2
    res = gl("--nproc_per_node", "cpu", "--dry-run", "--json", "t.py", cwd=tmp_path)
    assert json.loads(res.stdout)["world_size"] == os.cpu_count()
    for option, words in [
        ("--node-rank", "starts every node itself"),
        ("--rdzv-endpoint", "no rendezvous"),
        ("--rdzv_backend", "no rendezvous"),
    ]:
        res = gl(option, "1", "t.py", cwd=tmp_path)
        assert res.returncode == 2 and words in res.stderr and "Traceback" not in res.stderr, res.stderr
    res = gl("--nnodes", "1:2", "t.py", cwd=tmp_path)
    assert res.returncode == 2 and "elastic" in res.stderr


def test_what_cannot_be_meant_stops_before_any_rank_starts(tmp_path):
    res = gl("--num_devices", "2", "missing.py", cwd=tmp_path)
    assert res.returncode == 2 and "missing.py: no such file" in res.stderr and "[rank" not in res.stdout
    res = gl("python", "train.py", cwd=tmp_path)
    assert res.returncode == 2 and "drop 'python'" in res.stderr
    res = gl("version", cwd=tmp_path)
    assert res.returncode == 2 and "did you mean gaudi-launch --version?" in res.stderr
    for flag in ("-V", "--version"):
        assert gl(flag, cwd=tmp_path).stdout.strip() == f"gaudi-launch {__version__}"


def test_slips_that_change_a_run_get_one_note(tmp_path):
    (tmp_path / "plain.py").write_text("print('ran')\n")
    res = gl("--num_devices", "1", "plain.py", "--num_devices", "2", cwd=tmp_path)
    assert res.returncode == 0
    assert res.stderr.count("note: --num_devices after the script goes to the script") == 1
    (tmp_path / "own.py").write_text(
        "import argparse\np = argparse.ArgumentParser()\n"
        "p.add_argument('--num_devices')\np.add_argument('--local_rank', type=int)\n"
        "print(p.parse_known_args()[0].local_rank)\n"
    )
    res = gl("--num_devices", "1", "own.py", "--num_devices", "2", cwd=tmp_path)
    assert "after the script" not in res.stderr  # the script defines it: it is the script's
    assert "own.py parses --local_rank but it is not appended" in res.stderr and "[rank 0] None" in res.stdout
    res = gl("--num_devices", "1", "--append-local-rank", "own.py", cwd=tmp_path)
    assert "parses --local_rank" not in res.stderr and "[rank 0] 0" in res.stdout


def test_env_reports_versions_devices_and_tools_without_torch(tmp_path):
    res = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "gaudi_launch", "env", "--json"],
        capture_output=True,
        text=True,
        cwd=str(tmp_path),
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    info = json.loads(res.stdout)
    import torch

    assert info["packages"]["torch"] == torch.__version__ and info["packages"]["habana-torch-plugin"] is None
    assert info["packages"]["gaudi-launch"] == __version__
    assert info["tools"]["OpenMPI"].startswith("mpirun (Open MPI)") and "pdsh" in info["tools"]["pdsh"]
    assert info["devices"]["count"] >= 1 and info["cpus"] == os.cpu_count()
    assert any(n["name"] == "lo" for n in info["nics"])
    assert not any(line.rstrip().endswith("| torch") for line in res.stderr.splitlines())  # torch never imported
    text = gl("env", cwd=tmp_path).stdout
    assert "packages:" in text and f"gaudi-launch           {__version__}" in text


def test_check_has_its_own_help(tmp_path):
    res = gl("check", "--help", cwd=tmp_path)
    assert res.returncode == 0 and res.stdout.strip().startswith("Usage: gaudi-launch check [OPTIONS] [SCRIPT]")
    assert "--hostfile" in res.stdout and "--dry-run" not in res.stdout and "--log-dir" not in res.stdout


def test_shell_completion_completes_options(tmp_path):
    import shutil

    exe = shutil.which("gaudi-launch", path=os.path.dirname(sys.executable))
    env = dict(os.environ, COMP_WORDS="gaudi-launch --hostf", COMP_CWORD="1", _GAUDI_LAUNCH_COMPLETE="complete_bash")
    res = subprocess.run([exe], capture_output=True, text=True, env=env, cwd=str(tmp_path), timeout=60)
    assert res.returncode == 0 and res.stdout.split() == ["--hostfile", "--hostfile_path", "--hostfile-path"]
    shown = subprocess.run(
        [exe, "--show-completion", "bash"],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, SHELL="/bin/bash"),
    )
    assert "_GAUDI_LAUNCH_COMPLETE" in shown.stdout
