"""Mutants the equivalence suite must catch: each is one deliberate bug in the runtime; the suite run against
it must fail. A suite that still passes with one of them in place cannot see that bug.

    .venv/bin/python tests/equivalence/mutants.py            # every mutant (about 20 min on 2 busy cores)
    .venv/bin/python tests/equivalence/mutants.py gradients_x2 warmup_off_by_one

Each mutant is applied to a copy of the tree (gaudi_launch/, tests/, scripts/, pyproject.toml) in a new
temporary directory, never to the working tree (the copies stay, with each run's pytest output in NAME.log),
and its tests run there with EQUIV_WORLDS=1 (the one-rank job only, to save time; the DeepSpeed tests need 2
ranks and run whole). A mutant is caught when pytest reports failed tests and no errors; errors (a job that
failed or timed out) are no verdict and are reported as not run. Prints one line per mutant and exits 1 if
any was not caught.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HF_TESTS = "tests/equivalence/test_vs_hf_trainer.py"
DS_TESTS = "tests/equivalence/test_vs_deepspeed.py"


@dataclass(frozen=True)
class Mutant:
    name: str
    why: str  # the bug, in words
    path: str  # the file changed, relative to the root
    old: str  # text found exactly once in it
    new: str  # what replaces it
    tests: str = HF_TESTS


MUTANTS = [
    Mutant(
        "loss_scaling_dropped",
        "each micro-batch's mean loss back-propagated as it is (no token weighting, no division over the "
        "step), while the loss logged stays right",
        "gaudi_launch/runtime/trainer.py",
        "        loss.backward()\n",
        "        raw.backward()\n",
    ),
    Mutant(
        "gradients_x2",
        "every gradient doubled before the clip and the optimizer step",
        "gaudi_launch/runtime/trainer.py",
        "        norm = None\n        clip = args.max_grad_norm",
        "        for p in self.model.parameters():\n"
        "            if p.grad is not None:\n"
        "                p.grad.mul_(2)\n"
        "        norm = None\n        clip = args.max_grad_norm",
    ),
    Mutant(
        "warmup_off_by_one",
        "the linear warm-up one step longer than asked",
        "gaudi_launch/runtime/optim.py",
        "    warmup = max(0, warmup_steps(args, total))\n",
        "    warmup = max(0, warmup_steps(args, total)) + 1\n",
    ),
    Mutant(
        "decay_group_lost",
        "the no-decay group lost: biases and norm weights decayed too (the two groups kept, so that optimizer.pt "
        "still fits transformers' groups)",
        "gaudi_launch/runtime/optim.py",
        '{"params": no_decay, "weight_decay": 0.0}',
        '{"params": no_decay, "weight_decay": weight_decay}',
    ),
    Mutant(
        "eval_not_sample_weighted",
        "every eval batch weighs a whole batch (the short last one and a last round's completion too)",
        "gaudi_launch/runtime/trainer.py",
        "                weight = eval_batch_weight(\n",
        "                weight = args.per_device_eval_batch_size or eval_batch_weight(\n",
    ),
    Mutant(
        "deepspeed_boundary_removed",
        "DeepSpeed not told where our optimizer steps end (it counts its own accumulation steps)",
        "gaudi_launch/runtime/trainer.py",
        "            self.engine.set_gradient_accumulation_boundary(last)\n",
        "",
        DS_TESTS,
    ),
]


def apply(mutant: Mutant, tree: Path) -> None:
    file = tree / mutant.path
    text = file.read_text()
    if text.count(mutant.old) != 1:
        raise SystemExit(f"mutants.py: {mutant.name}: the text to change is not found exactly once in {mutant.path}")
    file.write_text(text.replace(mutant.old, mutant.new))


def copy_tree(dest: Path) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("gaudi_launch", "tests", "scripts"):
        shutil.copytree(ROOT / name, dest / name, ignore=ignore)
    shutil.copy2(ROOT / "pyproject.toml", dest / "pyproject.toml")


def run(mutant: Mutant, base: Path) -> tuple[str, float, str]:
    tree = base / mutant.name
    copy_tree(tree)
    apply(mutant, tree)
    env = {**os.environ, "PYTHONPATH": str(tree), "EQUIV_WORLDS": "1"}
    start = time.monotonic()
    res = subprocess.run(
        [sys.executable, "-m", "pytest", mutant.tests, "-q", "-p", "no:cacheprovider", "-x"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
    )
    (base / f"{mutant.name}.log").write_text(res.stdout + res.stderr)
    failed = [line.split(" ")[1] for line in res.stdout.splitlines() if line.startswith("FAILED ")]
    errors = [line for line in res.stdout.splitlines() if line.startswith("ERROR ")]
    if res.returncode == 1 and failed and not errors:
        verdict = "caught"
    elif res.returncode == 0:
        verdict = "NOT CAUGHT (every test passed)"
    else:  # errors (a fixture's job that failed or timed out) are no verdict on the mutant
        verdict = f"NOT RUN (pytest exit {res.returncode}; {len(errors)} errors): {res.stdout[-300:]}"
    return verdict, time.monotonic() - start, ", ".join(failed[:3])


def main(names: list[str]) -> int:
    chosen = [m for m in MUTANTS if not names or m.name in names]
    unknown = set(names) - {m.name for m in MUTANTS}
    if unknown:
        print(f"mutants.py: unknown mutant(s) {', '.join(sorted(unknown))}", file=sys.stderr)
        return 2
    missed = 0
    # The trees and each run's pytest output (NAME.log) stay for a look; the directory is printed.
    base = tempfile.mkdtemp(prefix="mutants-")
    print(f"mutants.py: trees and logs in {base}", flush=True)
    for mutant in chosen:
        verdict, took, failed = run(mutant, Path(base))
        missed += not verdict.startswith("caught")
        print(f"{mutant.name}: {verdict} in {took:.0f} s; first failed: {failed or '-'}  ({mutant.why})", flush=True)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
