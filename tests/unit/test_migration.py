"""Migration hazards from gaudi_spawn / DeepSpeed (issue 10 item 12): what the README's
"Differences from DeepSpeed / gaudi_spawn / torchrun" says is what the CLI does."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.unit.cli_helpers import plan_of, user_error

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()

pytestmark = pytest.mark.usefixtures("isolated")  # tests/unit/conftest.py


@pytest.fixture
def two_8_slot_hosts(tmp_path) -> str:
    path = tmp_path / "hostfile"
    path.write_text("worker-0 slots=8\nworker-1 slots=8\n")
    return str(path)


def usage_section(title: str) -> str:
    usage = README.split("\n## Usage\n", 1)[1].split("\n## ", 1)[0]
    assert f"\n### {title}\n" in usage, f"'{title}' is not under ## Usage"
    return usage.split(f"\n### {title}\n", 1)[1].split("\n### ", 1)[0]


def test_readme_lists_the_differences_under_usage():
    text = usage_section("Differences from DeepSpeed / gaudi_spawn / torchrun")
    rows = [line for line in text.splitlines() if re.match(r"\| (DeepSpeed|torchrun|gaudi_spawn)", line)]
    assert len(rows) >= 15
    for needle in (
        "`--world_size` is ranks per node, even with a hostfile",
        "A hostfile without `--use_deepspeed` runs `mpirun`",
        "`--num_nodes` above the host count",
        "uneven selections",
        "`--local_rank=N`",
        "`OMP_NUM_THREADS=1`",
        "`TORCHELASTIC_USE_AGENT_STORE`",
        "`ValueError`",
    ):
        assert needle in text, needle


def test_world_size_is_ranks_per_node_even_with_a_hostfile(capsys, two_8_slot_hosts):
    plan = plan_of(capsys, "--hostfile", two_8_slot_hosts, "--world_size", "8", "train.py")
    assert plan["world_size"] == 16 and [len(n["ranks"]) for n in plan["nodes"]] == [8, 8]
    err = user_error(capsys, "--hostfile", two_8_slot_hosts, "--world_size", "16", "--dry-run", "train.py")
    assert "--num_devices" in err and "16" in err


def test_a_hostfile_without_use_deepspeed_runs_mpirun(capsys, two_8_slot_hosts):
    assert plan_of(capsys, "--hostfile", two_8_slot_hosts, "train.py")["backend"] == "mpirun"
    plan = plan_of(capsys, "--hostfile", two_8_slot_hosts, "--use_deepspeed", "train.py")
    assert plan["backend"] == "deepspeed"
