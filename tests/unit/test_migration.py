"""Migration hazards from gaudi_spawn / DeepSpeed (issue 10 item 12): what docs/migrating.md
("Differences from DeepSpeed / gaudi_spawn / torchrun") and the README say is what the CLI does."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.unit.cli_helpers import plan_of, user_error

ROOT = Path(__file__).resolve().parents[2]
MIGRATING = (ROOT / "docs" / "migrating.md").read_text()
README = (ROOT / "README.md").read_text()

pytestmark = pytest.mark.usefixtures("isolated")  # tests/unit/conftest.py


@pytest.fixture
def two_8_slot_hosts(tmp_path) -> str:
    path = tmp_path / "hostfile"
    path.write_text("worker-0 slots=8\nworker-1 slots=8\n")
    return str(path)


def test_the_docs_list_the_differences():
    assert MIGRATING.startswith("# Differences from DeepSpeed / gaudi_spawn / torchrun\n")
    text = MIGRATING
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
    for needle in ("`--world_size` is ranks per node, even with a hostfile", "A hostfile without `--use_deepspeed`"):
        assert needle in README, needle  # the two easy to miss stay on the README's first screenfuls


def test_world_size_is_ranks_per_node_even_with_a_hostfile(capsys, two_8_slot_hosts):
    plan = plan_of(capsys, "--hostfile", two_8_slot_hosts, "--world_size", "8", "train.py")
    assert plan["world_size"] == 16 and [len(n["ranks"]) for n in plan["nodes"]] == [8, 8]
    err = user_error(capsys, "--hostfile", two_8_slot_hosts, "--world_size", "16", "--dry-run", "train.py")
    assert "--num_devices" in err and "16" in err


def test_a_hostfile_without_use_deepspeed_runs_mpirun(capsys, two_8_slot_hosts):
    assert plan_of(capsys, "--hostfile", two_8_slot_hosts, "train.py")["backend"] == "mpirun"
    plan = plan_of(capsys, "--hostfile", two_8_slot_hosts, "--use_deepspeed", "train.py")
    assert plan["backend"] == "deepspeed"
