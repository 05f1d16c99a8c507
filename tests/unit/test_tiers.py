"""The test tiers (tests/conftest.py TIERS, pyproject's markers): what the quick tier leaves out, and that
it imports no torch (the stand-in's device is registered only once a test module outside tests/unit loads)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import tiers_of

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import sys, pytest
pytest.main(["--quick", "--collect-only", "-q", "-p", "no:cacheprovider", "tests"])
print("IMPORTED", *[m for m in ("torch", "transformers", "deepspeed", "hpu_stand_in_device") if m in sys.modules])
"""


def test_tiers_follow_folders_files_and_test_ids():
    assert tiers_of("cluster/test_multinode.py::test_x[mpirun]") == {"cluster", "slow"}
    assert tiers_of("integration/test_supervisor.py::test_x") == {"slow"}
    assert tiers_of("integration/test_private_files.py::test_x") == {"cluster", "slow"}
    assert tiers_of("unit/test_lint.py::test_ruff_finds_nothing") == {"lint"}
    assert tiers_of("unit/remote/test_fanout.py::test_a_host_past_the_timeout_gets_the_default") == {"slow"}
    assert tiers_of("unit/remote/test_fanout.py::test_a_host_past_the_timeout_gets_the_default_x") == set()
    assert tiers_of("unit/test_layout.py::test_x") == set()
    assert tiers_of("runtimes/test_x.py") == set()  # a folder's name, not a prefix of one


def test_the_quick_tier_is_the_unit_tests_without_slow_or_lint_ones_and_imports_no_torch():
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, timeout=120)
    ids = [line for line in out.stdout.splitlines() if "::" in line]
    assert len(ids) > 500, out.stdout[-2000:] + out.stderr[-2000:]
    assert {i.split("/")[1] for i in ids} == {"unit"}
    assert not [i for i in ids if tiers_of(i[len("tests/") :])], "a slow, cluster or lint test in the quick tier"
    assert "tests/unit/test_layout.py::test_the_parser_reads_packages_and_flags_what_is_missing" in ids
    assert not [i for i in ids if i.startswith(("tests/unit/test_lint.py", "tests/unit/test_fuzz_plan.py"))]
    assert out.stdout.splitlines()[-1] == "IMPORTED", out.stdout.splitlines()[-1]
