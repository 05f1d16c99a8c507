"""Our Trainer against transformers' Trainer (5.24, with accelerate 1.15, DDP over gloo): the shipped tiny
GPT-2 (run_clm's data), BERT (run_mlm's collator, the head on every position) and T5 (run_summarization's
data, padded), the same initial weights, data, seed and flags, fp32, on 1 and 2 CPU ranks, with gradient
accumulation (3, over epochs of 13 and 7 batches: each epoch ends on a short step), a clip that binds, a
linear warm-up, weight decay, evaluation after each epoch, and a save and resume.

Tolerance: 1e-5 relative on every logged loss, learning rate and eval loss. Both sides run the same
kernels in fp32 on the same inputs; what differs is the order of a few sums (the loss normalised inside
GPT-2's loss function against our mean x count / total; torch's fused AdamW is used on both sides). The
measured gap is at most 1.5e-7 relative (losses, eval losses, the resumed run; masked-only head against
every position 7.5e-8; learning rates equal); 1e-5 leaves room for other CPUs' kernels while a single wrong
sample, token count or step boundary moves a loss by 3e-3 or more (measured by undoing each fix alone).
Final weights: 1e-4 relative to the largest weight (measured 1.9e-5: AdamW's first steps divide by
near-zero second moments, which amplifies rounding).
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gaudi_launch.runtime.sampling import batches_per_rank, deal_batches, epoch_order, window_sizes

ROOT = Path(__file__).resolve().parents[2]
HARNESS = ROOT / "tests" / "equivalence" / "harness.py"
REL = 1e-5
CASES = ("gpt2", "bert", "t5")


@pytest.fixture(scope="module")
def init_dir(tmp_path_factory):
    sys.path.insert(0, str(ROOT))
    from tests.equivalence.harness import save_initial_weights

    path = tmp_path_factory.mktemp("init")
    save_initial_weights(str(path))
    return path


def _run(init_dir, out, ranks: int) -> list[dict]:
    out.mkdir()
    cmd = [sys.executable, str(HARNESS), str(init_dir), str(out)]
    if ranks > 1:
        cmd = [sys.executable, "-m", "gaudi_launch", "--num_devices", str(ranks)] + cmd[1:]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=400, cwd=str(ROOT))
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(ranks)]


@pytest.fixture(scope="module")
def runs(init_dir, tmp_path_factory):
    """{ranks: [per-rank results]}: one 1-rank job and one 2-rank job, each running both trainers."""
    base = tmp_path_factory.mktemp("runs")
    return {1: _run(init_dir, base / "one", 1), 2: _run(init_dir, base / "two", 2)}


PARAMS = [pytest.param(w, c, id=f"{c}-{w}rank") for w, c in itertools.product((1, 2), CASES)]


def test_deal_batches_is_accelerates_order_and_sharding():
    # The pure rules against accelerate's own classes over many shapes: seeded shuffle per epoch,
    # batches dealt to ranks in turn, a short last round completed from the epoch's start.
    from accelerate.data_loader import BatchSamplerShard, SeedableRandomSampler
    from torch.utils.data import BatchSampler

    for n, batch, world, drop_last, epoch in itertools.product(
        range(1, 23), (1, 2, 3), (1, 2, 3), (False, True), (0, 1)
    ):
        sampler = SeedableRandomSampler(data_source=range(n), data_seed=5)
        sampler.set_epoch(epoch)
        order = list(sampler)
        assert order == epoch_order(n, 5, epoch)
        batches = BatchSampler(order, batch, drop_last)
        for rank in range(world):
            ref = list(BatchSamplerShard(batches, world, rank, even_batches=True)) if world > 1 else list(batches)
            assert deal_batches(order, batch, world, rank, drop_last) == ref, (n, batch, world, drop_last, rank)
            assert batches_per_rank(n, batch, world, drop_last) == len(ref)
    # One rank in HPU lazy mode: the short last batch filled from the start (static shapes).
    assert deal_batches([4, 0, 3, 1, 2], 2, 1, 0, pad_last=True) == [[4, 0], [3, 1], [2, 4]]


def test_window_sizes_end_each_epoch_on_a_short_step():
    # transformers' Trainer._run_epoch: ceil(batches / accumulation) steps, the last one what is left.
    assert window_sizes(13, 3) == [3, 3, 3, 3, 1]
    assert window_sizes(7, 3) == [3, 3, 1]
    assert window_sizes(6, 3) == [3, 3]
    assert window_sizes(2, 3) == [2]


@pytest.mark.parametrize("world,case", PARAMS)
def test_data_order_is_hfs_on_every_rank(runs, world, case):
    for rank in runs[world]:
        hf, ours = rank[case]["hf"]["order"], rank[case]["ours"]["order"]
        assert ours == hf


@pytest.mark.parametrize("world,case", PARAMS)
def test_accumulation_steps_and_losses_at_epoch_ends_are_hfs(runs, world, case):
    # Item 4: 13 (1 rank) or 7 (2 ranks) batches an epoch, accumulation 3: HF takes 5 or 3 optimizer steps
    # an epoch, the last on the 1 batch left, and starts the next epoch afresh.
    hf, ours = runs[world][0][case]["hf"], runs[world][0][case]["ours"]
    assert hf["global_step"] == {1: 10, 2: 6}[world]
    assert ours["global_step"] == hf["global_step"]
    assert ours["step"] == hf["step"]
    assert ours["loss"] == pytest.approx(hf["loss"], rel=REL)
    assert ours["train_loss"] == pytest.approx(hf["train_loss"], rel=REL)


@pytest.mark.parametrize("world,case", PARAMS)
def test_logged_learning_rate_is_hfs(runs, world, case):
    # The rate the step used (HF logs it before the scheduler steps): 0 on the first warm-up step.
    hf, ours = runs[world][0][case]["hf"], runs[world][0][case]["ours"]
    assert hf["lr"][0] == 0.0
    assert ours["lr"] == pytest.approx(hf["lr"], rel=REL, abs=1e-12)


@pytest.mark.parametrize("world,case", PARAMS)
def test_eval_loss_after_each_epoch_is_hfs(runs, world, case):
    # 7 eval samples in batches of 2: a short last batch on 1 rank, a last round completed from the start
    # on 2 (HF weighs each rank's batch loss by its samples, leaving the completion out).
    hf, ours = runs[world][0][case]["hf"], runs[world][0][case]["ours"]
    assert len(hf["eval_loss"]) == 2
    assert ours["eval_loss"] == pytest.approx(hf["eval_loss"], rel=REL)


@pytest.mark.parametrize("world,case", PARAMS)
def test_final_weights_are_hfs(runs, world, case):
    for rank in runs[world]:
        assert rank[case]["ours"]["weights_vs_hf"] < 1e-4


@pytest.mark.parametrize("world,case", PARAMS)
def test_resumed_run_goes_on_as_hfs_unbroken_run(runs, world, case):
    # Resumed one step into the second epoch (batches skipped by index), to the end.
    entry = runs[world][0][case]
    hf, resumed = entry["hf"], entry["resumed"]
    start = resumed["from_step"]
    assert resumed["step"] == hf["step"][start:]
    assert resumed["loss"] == pytest.approx(hf["loss"][start:], rel=REL)
    assert resumed["eval_loss"] == pytest.approx(hf["eval_loss"][-1:], rel=REL)


@pytest.mark.parametrize("world", (1, 2))
def test_masked_only_mlm_head_is_the_only_difference(runs, world):
    # --mlm_head_masked_only (on by default off HPU) runs BERT's head on the masked positions only: the
    # same loss up to float rounding, so it gives HF's numbers as the every-position head does.
    entry = runs[world][0]["bert"]
    masked, every, hf = entry["masked_only"], entry["ours"], entry["hf"]
    assert masked["loss"] == pytest.approx(every["loss"], rel=REL)
    assert masked["eval_loss"] == pytest.approx(every["eval_loss"], rel=REL)
    assert masked["loss"] == pytest.approx(hf["loss"], rel=REL)


def test_token_counts_vary_so_normalisation_matters():
    # The BERT and T5 batches carry different numbers of scored tokens, which is what makes a per-batch
    # mean differ from HF's token-weighted loss: a check that the suite tests what it means to.
    sys.path.insert(0, str(ROOT))
    from tests.equivalence.harness import case_data

    for case in ("bert", "t5"):
        train, _, collator = case_data(case)
        counts = {int((collator(train[i : i + 2])["labels"] != -100).sum()) for i in range(0, 12, 2)}
        assert len(counts) > 1, case
    assert torch.is_tensor(collator(train[:2])["decoder_input_ids"])


def test_data_seed_and_token_normalisation_flags(tmp_path):
    # --data_seed shuffles the training data as HF's data_seed does (else --seed); a step's micro-batch
    # losses are weighted by their scored tokens (labels not -100; a causal LM's from position 1).
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM

    from gaudi_launch.runtime.args import TrainingArguments
    from gaudi_launch.runtime.data import ASSETS
    from gaudi_launch.runtime.trainer import Trainer, loss_shifts_labels

    gpt2 = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(f"{ASSETS}/tiny-gpt2"))
    gpt2.loss_type = "ForCausalLM"
    assert loss_shifts_labels(gpt2)
    assert not loss_shifts_labels(AutoModelForSeq2SeqLM.from_config(AutoConfig.from_pretrained(f"{ASSETS}/tiny-t5")))
    items = [{"input_ids": torch.arange(4) + i, "labels": torch.arange(4) + i} for i in range(11)]
    for data_seed, seed in ((None, 3), (9, 3)):
        args = TrainingArguments(
            output_dir=str(tmp_path), device="cpu", seed=seed, data_seed=data_seed, per_device_train_batch_size=4
        )
        trainer = Trainer(gpt2, args, train_dataset=items, log=lambda s: None)
        sampler = trainer.train_dataloader().batch_sampler
        sampler.set_epoch(1)
        assert sampler.batches() == deal_batches(epoch_order(11, data_seed or seed, 1), 4, 1, 0)
    labels = torch.tensor([[1, 2, -100, -100], [1, 2, 3, 4]])
    scales = trainer._loss_scales([{"labels": labels[:1]}, {"labels": labels[1:]}])
    assert [float(s) for s in scales] == pytest.approx([1 / 4, 3 / 4])  # shifted: 1 and 3 scored tokens
    assert trainer._loss_scales([{"x": torch.ones(1)}] * 2) == [0.5, 0.5]  # no labels: the mean


@pytest.mark.parametrize("world", (1, 2))
@pytest.mark.parametrize("variant", ("stop_steps", "stop_epoch"))
def test_a_stop_inside_an_epoch_logs_and_evaluates_as_hf(runs, world, variant):
    # max_steps 7 ends inside an epoch. Logged every 3 steps: the mean loss since the last log. Evaluated
    # every 3 steps and at the stop (DefaultFlowCallback.on_step_end), or at each epoch's end and at the stop
    # (Trainer._run_epoch calls on_epoch_end after breaking off).
    hf, ours = runs[world][0]["gpt2"][variant]["hf"], runs[world][0]["gpt2"][variant]["ours"]
    assert hf["global_step"] == ours["global_step"] == 7
    assert ours["step"] == hf["step"] == [3, 6]
    assert ours["loss"] == pytest.approx(hf["loss"], rel=REL)
    assert ours["eval_step"] == hf["eval_step"]
    assert ours["eval_loss"] == pytest.approx(hf["eval_loss"], rel=REL)


@pytest.mark.parametrize("world", (1, 2))
def test_fast_ddp_gives_hfs_numbers_too(runs, world):
    entry = runs[world][0]["gpt2"]
    assert entry["fast_ddp"]["loss"] == pytest.approx(entry["hf"]["loss"], rel=REL)
    assert entry["fast_ddp"]["eval_loss"] == pytest.approx(entry["hf"]["eval_loss"], rel=REL)
    assert entry["fast_ddp"]["weights_vs_hf"] < 1e-4
