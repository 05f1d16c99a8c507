"""Every `gaudi-launch` command in the user docs' code blocks runs as written on one host (issue 37): each
launch is planned (--dry-run; --no-ssh-check where it names hosts this machine does not have), each
subcommand that needs no other host runs, and none trips the launcher's own notes. The few that cannot run
here are listed with the reason."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ["README.md", "docs/usage.md", "docs/multinode.md", "docs/slurm.md", "docs/long-runs.md", "docs/migrating.md"]
SUBCOMMANDS = ("check", "run", "env", "report", "completion")
# What cannot run on one host without other hosts, a shell to change or a run's files, and why.
CANNOT = {
    "check": "reaches every host over ssh",
    "--check-only": "reaches every host over ssh",
    "completion": "--install edits the shell's start-up file (tests/integration/test_terminal.py covers it)",
    "report": "reads a run's or a check's files (tests/unit/reports covers it)",
    "--hostfile H env": "reaches every host over ssh",
}


def commands() -> list[tuple[str, str]]:
    """(doc, command) for each gaudi-launch line of a code block, continuation lines joined, comments cut."""
    out = []
    for doc in DOCS:
        for block in re.findall(r"```(?:bash|sh)\n(.*?)```", (ROOT / doc).read_text(), re.S):
            text = re.sub(r"\\\n\s*", " ", block)
            for line in text.splitlines():
                line = re.sub(r"\s*\[[^\]]*\]", "", line.split("  #")[0]).strip()  # optional parts left out
                if line.startswith("gaudi-launch ") and "[OPTIONS]" not in line:
                    out.append((doc, line))
    return out


def why_not(words: list[str]) -> str:
    first = words[1]
    if first in ("check", "completion", "report") or "--check-only" in words:
        return CANNOT.get(first, CANNOT["--check-only"])
    if first == "env" and "--hostfile" in words:
        return CANNOT["--hostfile H env"]
    return ""


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    work = tmp_path_factory.mktemp("docs")
    for name in ("train.py", "run_clm.py", "scripts/run_clm.py", "my_pkg/__init__.py", "my_pkg/train.py"):
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        (work / name).write_text("")
    for hostfile in ("H", "hosts"):
        (work / hostfile).write_text("worker-0 slots=8\nworker-1 slots=8\n")
    (work / "hostfiles").mkdir()
    (work / "hostfiles" / "two-dl1-nodes").write_text((ROOT / "hostfiles" / "two-dl1-nodes").read_text())
    (work / "job.yaml").write_text("num_devices: 2\n")
    return work


def argv_of(words: list[str]) -> tuple[list[str], str]:
    """The command to run here, and where its stdout goes (a '> file' in the doc)."""
    words = [w for w in words if w != "..."]
    out = ""
    if ">" in words:
        out = words[words.index(">") + 1]
        words = words[: words.index(">")]
    if "|" in words:
        words = words[: words.index("|")]
    if words[1] not in SUBCOMMANDS:
        extra = ["--dry-run"] if "--dry-run" not in words else []
        if "--hostfile" in words:
            extra.append("--no-ssh-check")  # hosts this machine does not have
        words = [words[0], *extra, *words[1:]]
    elif words[1] == "run":
        words = [*words, "--dry-run"]
    return [sys.executable, "-m", "gaudi_launch", *words[1:]], out


@pytest.mark.parametrize("doc, line", commands())
def test_a_documented_command_runs_as_written(doc, line, workdir):
    words = shlex.split(line)
    reason = why_not(words)
    if reason:
        assert reason in CANNOT.values()
        return
    argv, out = argv_of(words)
    env = {**os.environ, "XDG_STATE_HOME": str(workdir / "state"), "NO_COLOR": "1", "COLUMNS": "120"}
    res = subprocess.run(argv, cwd=workdir, env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, f"{doc}: {line}\n{res.stderr[-2000:]}"
    assert "Traceback" not in res.stderr and "after the script goes to the script" not in res.stderr, res.stderr
    if out:
        (workdir / out).write_text(res.stdout)


def test_the_docs_hold_the_commands_a_newcomer_tries():
    lines = [line for _doc, line in commands()]
    assert len(lines) >= 20
    assert any("--include" in line for line in lines) and any(line.startswith("gaudi-launch run ") for line in lines)


def test_the_readmes_own_script_trains_on_two_ranks(tmp_path):
    # The README's "Your own training script" example, as printed there, through the launcher on CPU.
    blocks = re.findall(r"```python\n(# train\.py\n.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert len(blocks) == 1
    (tmp_path / "train.py").write_text(blocks[0])
    argv = [sys.executable, "-m", "gaudi_launch", "--num_devices", "2", "--device", "cpu", "train.py"]
    res = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    losses = [float(m) for m in re.findall(r"\[rank 0\] step \d+: loss ([0-9.]+)", res.stdout)]
    assert len(losses) == 2 and losses[1] < losses[0], res.stdout[-2000:]
