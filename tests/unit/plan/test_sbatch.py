"""--sbatch's script as sbatch and bash read it: every option value stays one option, nothing becomes a command."""

from __future__ import annotations

import os
import subprocess

import pytest

from gaudi_launch.backends.slurm import LATER
from gaudi_launch.errors import UserError
from gaudi_launch.inputs.spec import JobSpec
from gaudi_launch.plan import sbatch
from gaudi_launch.plan.launchplan import LaunchPlan, NodePlan


def sbatch_words(line: str) -> list[str]:
    """The options sbatch takes from one '#SBATCH ...' line, read as Slurm 22.05's src/sbatch/opt.c
    (_get_argument) reads them: whitespace separates, a backslash escapes the next character, single or
    double quotes group (the quotes dropped), an unquoted unescaped '#' ends the line."""
    words, i, text = [], 0, line[len("#SBATCH") :]
    while True:
        while i < len(text) and text[i].isspace():
            i += 1
        if i >= len(text):
            return words
        word, quote, escape = "", "", False
        while i < len(text) and (quote or not text[i].isspace()) and text[i] != "\n":
            c = text[i]
            i += 1
            if escape:
                escape = False
            elif c == "\\":
                escape = True
                continue
            elif quote:
                if c == quote:
                    quote = ""
                    continue
            elif c in "\"'":
                quote = c
                continue
            elif c == "#":
                return words + ([word] if word else [])
            word += c
        words.append(word)


def options(text: str) -> list[str]:
    """Every option sbatch reads from the script's directives (up to the first command, as sbatch)."""
    out = []
    for line in text.splitlines()[1:]:
        if line.startswith("#SBATCH"):
            out += sbatch_words(line)
        elif not line.startswith("#") and line.strip():
            break
    return out


def plan() -> LaunchPlan:
    return LaunchPlan(
        backend="slurm",
        world_size=4,
        master_addr="(first node)",
        master_port=29500,
        nodes=[NodePlan(LATER, 0, [0, 1], [0, 1]), NodePlan(LATER, 1, [0, 1], [2, 3])],
        env={},
        commands=[],
        program=["train.py"],
        job_id="abcd1234",
    )


@pytest.mark.parametrize(
    "field, value",
    [
        ("partition", "gaudi2 --hold"),
        ("time", "1:00:00 --dependency=afterok:1"),
        ("account", 'ml" "--hold'),
        ("partition", "p\\ --hold"),
        ("account", "acct#--hold"),
    ],
)
def test_allocation_options_stay_one_option_each(field, value):
    spec = JobSpec.build(program=["train.py"], backend="slurm", sbatch="job.sh", **{field: value})
    text = sbatch.script_text(plan(), spec, "/w/job.sh.env", "/w")
    got = options(text)
    assert f"--{field}={value}" in got
    assert "--hold" not in got and not any(w.startswith("--dependency") for w in got)


def test_slurm_args_keep_their_words():
    spec = JobSpec.build(
        program=["train.py"], backend="slurm", sbatch="job.sh", slurm_args="--comment='a b --hold' --exclusive"
    )
    got = options(sbatch.script_text(plan(), spec, "/w/job.sh.env", "/w dir"))
    assert got == [
        "--job-name=gaudi-launch-abcd1234",
        "--nodes=2",
        "--ntasks-per-node=2",
        "--chdir=/w dir",
        "--comment=a b --hold",
        "--exclusive",
    ]


def test_a_control_character_in_an_option_is_refused():
    for spec in (
        JobSpec.build(program=["train.py"], backend="slurm", sbatch="job.sh", account="ml\t--hold"),
        JobSpec.build(program=["train.py"], backend="slurm", sbatch="job.sh", slurm_args="'--comment=a\nb'"),
    ):
        with pytest.raises(UserError, match="control character"):
            sbatch.script_text(plan(), spec, "/w/job.sh.env", "/w")


@pytest.mark.parametrize("path", ["job\ntouch PWNED\n.sh", "job\r.sh", "job\x1b[2J.sh"])
def test_a_control_character_in_the_script_path_is_refused(tmp_path, monkeypatch, path):
    monkeypatch.chdir(tmp_path)
    spec = JobSpec.build(program=["train.py"], backend="slurm", sbatch=path)
    with pytest.raises(UserError, match="--sbatch") as err:
        sbatch.write(plan(), spec, {})
    assert "control character" in str(err.value)
    assert os.listdir(tmp_path) == []


def test_the_script_runs_no_command_from_its_path_or_values(tmp_path):
    """bash itself reads the script (with `exec` replaced): only the one gaudi-launch command runs."""
    spec = JobSpec.build(
        program=["train.py"],
        backend="slurm",
        sbatch=str(tmp_path / "a b $(touch x).sh"),
        partition="p;touch y",
        slurm_args="--comment='$(touch z)'",
    )
    text = sbatch.script_text(plan(), spec, str(tmp_path / "a b $(touch x).sh.env"), str(tmp_path))
    (tmp_path / "job.sh").write_text(text.replace("\nexec ", "\nprintf '%s\\n' "))
    out = subprocess.run(["bash", str(tmp_path / "job.sh")], cwd=tmp_path, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert sorted(os.listdir(tmp_path)) == ["job.sh"]
