"""Our Trainer under --deepspeed against DeepSpeed's own engine (0.19.8) in a plain loop driven as
accelerate 1.15 drives it for transformers' Trainer (5.24): the shipped tiny GPT-2, fp32, 2 CPU ranks
(gloo), ZeRO stages 1, 2 and 3, gradient accumulation 3 over epochs of 7 micro-batches (each epoch
ends in a short step), clipping, DeepSpeed's AdamW and warm-up/decay schedule. One launch runs every
scenario (tests/equivalence/ds_ranks.py); each test reads its part. transformers' own Trainer runs there
too, under the same ZeRO-2 config, and is compared with our ZeRO-2 run.

Tolerance: 1e-5 on every micro-batch's loss, on each rank. Both sides run the same kernels in the
same order on the same data, so they agree to float32 rounding (observed: identical to 1e-6); 1e-5
leaves room for reduction order and is far below what one wrong step, boundary or lost partition
moves a loss (1e-3 and more).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
RANKS = os.path.join(os.path.dirname(__file__), "ds_ranks.py")
TOL = 1e-5
# 7 micro-batches an epoch in steps of 3: 3, 3, then the epoch's leftover 1 (transformers' rule).
WINDOWS = [3, 3, 1, 3, 3, 1, 3, 3]
N = 4  # ds_ranks.py's: a checkpoint at N, resumed to 2N (the test reads ds_ranks' results, never imports it:
# DeepSpeed's import stays out of the pytest process)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("vs_deepspeed")
    # This tree's runtime in the ranks (whatever gaudi_launch is installed), DeepSpeed on the CPU.
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "PYTHONPATH": path}
    res = subprocess.run(
        [sys.executable, "-m", "gaudi_launch", "--num_devices", "2", RANKS, str(out)],
        capture_output=True,
        text=True,
        cwd=str(out),
        env=env,
        timeout=600,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    constants = results.pop("constants")
    assert (constants["N"], constants["BLOCK"], constants["CLM_EVAL_SAMPLES"]) == (N, 32, 8)
    return out, results


def scenario(runs, key: str) -> list[dict]:
    """Both ranks' results of one scenario; a scenario that raised fails here with its traceback."""
    ranks = runs[1][key]
    for rank, res in enumerate(ranks):
        assert "error" not in res, f"{key} failed on rank {rank}:\n{res.get('traceback', res['error'])}"
    return ranks


def assert_losses_equal(ours: list[list[float]], ref: list[list[float]], what: str) -> None:
    assert [len(s) for s in ours] == [len(s) for s in ref], f"{what}: micro-batches per step differ"
    for i, (a, b) in enumerate(zip(ours, ref)):
        for j, (x, y) in enumerate(zip(a, b)):
            assert abs(x - y) <= TOL, f"{what}: step {i + 1}, micro-batch {j + 1}: {x} against {y}"


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_per_step_losses_match_deepspeeds_own_engine(runs, stage):
    ours, ref = scenario(runs, f"zero{stage}/ours"), scenario(runs, f"zero{stage}/reference")
    for rank in range(2):
        assert [len(s) for s in ref[rank]["steps"]] == WINDOWS  # the reference's own grouping
        assert_losses_equal(ours[rank]["steps"], ref[rank]["steps"], f"ZeRO-{stage} rank {rank}")
        # Training moved the model: equal curves are not two untouched models.
        assert ours[rank]["steps"][-1][-1] < ours[rank]["steps"][0][0] - 0.3


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_deepspeeds_step_count_follows_ours_through_short_steps_at_epoch_ends(runs, stage):
    # item 4: the engine steps exactly when our loop ends a step, the epochs' short ones included.
    for res in scenario(runs, f"zero{stage}/ours"):
        assert res["step"] == 2 * N
        assert [len(s) for s in res["steps"]] == WINDOWS
        assert res["global_steps"] == list(range(1, 2 * N + 1))  # engine.global_steps after each of ours


@pytest.mark.parametrize("name", ["zero1", "zero2", "zero3", "zero2-own"])
def test_a_resumed_deepspeed_run_logs_the_uninterrupted_runs_losses(runs, name):
    # item 1: checkpoint-N holds every rank's ZeRO partition (DeepSpeed's own files, in our atomic
    # checkpoint-N), and "latest" (what a --max-restarts restart resumes from) finds and restores it into
    # a model built from another seed. "zero2-own": no optimizer/scheduler block, ours handed over.
    full, resumed = scenario(runs, f"{name}/ours"), scenario(runs, f"{name}/resumed")
    for rank in range(2):
        shards = full[rank]["shards"]
        assert {f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in range(2)} <= set(shards)
        files = set(full[rank]["checkpoint"])
        assert {"trainer_state.json", "gaudi_launch_state.json", "rng_state_0.pth", "rng_state_1.pth"} <= files
        assert "deepspeed" in files and "model.safetensors" not in files  # rank 0's partition alone is no model
        assert resumed[rank]["global_steps"] == list(range(N + 1, 2 * N + 1))
        assert_losses_equal(resumed[rank]["steps"], full[rank]["steps"][N:], f"{name} resumed, rank {rank}")


def test_zero3_builds_the_model_partitioned_on_every_rank(runs):
    # item 2: prepare_deepspeed registers the config with transformers before the model is built, so
    # from_config runs under zero.Init and no rank ever holds the whole model.
    for key in ("zero3/ours", "zero3/resumed"):
        assert all(res["built_partitioned"] for res in scenario(runs, key))
    for key in ("zero1/ours", "zero2/ours"):
        assert not any(res["built_partitioned"] for res in scenario(runs, key))
    # The shipped script does the same: the Trainer's warning about a whole-model build stays silent.
    assert scenario(runs, "zero3/clm") == [{"warnings": []}, {"warnings": []}]


def test_a_model_saved_by_a_zero3_run_loads_in_plain_transformers_with_the_same_eval_loss(runs):
    # item 2: run_clm.py under ZeRO-3 saves the model (weights gathered from the partitions), then
    # evaluates; plain transformers, without DeepSpeed, loads it and gets the eval loss the run reported.
    from transformers import AutoModelForCausalLM

    from gaudi_launch.runtime import data

    out = runs[0] / "clm"
    block, samples = 32, 8  # ds_ranks.run_clm's --block_size and --max_eval_samples
    reported = json.loads((out / "results.json").read_text())["eval"]["eval_loss"]
    model = AutoModelForCausalLM.from_pretrained(str(out))
    model.eval()
    tok = data.load_tokenizer(str(out))
    texts = data.load_text_files(None, None)
    evals = data.BlockDataset(data.tokenize_and_group(texts["validation"], tok, block)[:samples])
    with torch.no_grad():
        # Every block is full: the mean over all tokens is the run's mean over ranks and batches.
        loss = model(input_ids=evals.input_ids, labels=evals.labels).loss.item()
    assert math.isfinite(loss) and abs(loss - reported) <= TOL, (loss, reported)
    assert reported < json.loads((out / "results.json").read_text())["eval_before"]["eval_loss"]


def test_transformers_trainer_itself_under_zero2_logs_our_losses(runs):
    # transformers' own Trainer with TrainingArguments(deepspeed=<the ZeRO-2 dict ours gets>), through
    # accelerate, on the same 2-rank world, model, data, seed and flags. Its forward divides each
    # micro-batch's token sum by the tokens of the whole step on all ranks (num_items_in_batch, averaged
    # across devices); every block is full, so that is our micro-batch mean / (micro-batches x ranks).
    ours, hf = scenario(runs, "zero2/ours"), scenario(runs, "zero2/hf")
    for rank in range(2):
        assert hf[rank]["step"] == ours[rank]["step"] == 2 * N
        assert hf[rank]["global_steps"] == list(range(1, 2 * N + 1))
        scaled = [[x * len(step) * 2 for x in step] for step in hf[rank]["steps"]]
        assert_losses_equal(ours[rank]["steps"], scaled, f"transformers' Trainer ZeRO-2 rank {rank}")
    # Its logged loss at every step: the mean over both ranks' micro-batches of ours.
    mean = [sum(a + b) / len(a + b) for a, b in zip(ours[0]["steps"], ours[1]["steps"])]
    logged = hf[0]["logged"]
    assert len(logged) == len(mean) == 2 * N
    for i, (x, y) in enumerate(zip(mean, logged)):
        assert abs(x - y) <= TOL, f"logged loss at step {i + 1}: ours {x} against transformers' {y}"
