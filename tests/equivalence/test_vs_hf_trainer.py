"""Our Trainer against transformers' Trainer (5.24, with accelerate 1.15, DDP over gloo): the shipped tiny
GPT-2 (run_clm's data), BERT (run_mlm's collator, the head on every position) and T5 (run_summarization's
data, padded), the same initial weights, data, seed and flags, fp32, on 1 and 2 CPU ranks, with gradient
accumulation (3, over epochs of 13 and 7 batches: each epoch ends on a short step), a clip that binds, a
linear warm-up, weight decay, evaluation after each epoch, and a save and resume; for GPT-2 also no clip,
dropout 0.1, bf16 autocast, and checkpoints resumed by the other trainer.

Tolerance: 1e-5 relative on every logged loss, grad_norm, learning rate and eval loss. Both sides run the
same kernels on the same inputs; what differs is the order of a few sums (the loss normalised inside
GPT-2's loss function against our mean x count / total; torch's fused AdamW is used on both sides). The
measured gap is at most 1.5e-7 relative (losses, grad norms, eval losses, the resumed runs, bf16; masked-only
head against every position 7.5e-8; learning rates equal); 1e-5 leaves room for other CPUs' kernels while a
single wrong sample, token count or step boundary moves a loss by 3e-3 or more (measured by undoing each fix
alone), and a gradient scale off by 2 moves grad_norm by 2x. Final weights: each tensor within 1e-5 of its
own largest value (measured 1.5e-6), so that a small tensor's error is not hidden under the largest weight;
the attention key biases (zero gradient in exact arithmetic: rounding noise) within 1e-4 absolute.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gaudi_launch.runtime.sampling import batches_per_rank, deal_batches, epoch_order, window_sizes

ROOT = Path(__file__).resolve().parents[2]
HARNESS = ROOT / "tests" / "equivalence" / "harness.py"
REL = 1e-5
W_REL = 1e-5  # each parameter against its own largest value (measured at most 1.5e-6)
KEY_BIAS_ABS = 1e-4  # absolute, for the key biases (measured at most 8e-6; query/value biases are about 9e-3)
SETTINGS_CLIP = 0.5  # harness.SETTINGS' max_grad_norm
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
    # Under pytest-timeout's 900 s for the test that starts it (one job per world: see _Runs).
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=850, cwd=str(ROOT))
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(ranks)]


@pytest.fixture(scope="module")
def runs(init_dir, tmp_path_factory):
    """{ranks: [per-rank results]}: one 1-rank job and one 2-rank job, each running both trainers."""
    return _Runs(init_dir, tmp_path_factory.mktemp("runs"))


class _Runs(dict):
    """Each world's job run when a test first asks for it, so that no one test waits for both."""

    def __init__(self, init_dir, base):
        super().__init__()
        self.init_dir, self.base = init_dir, base

    def __missing__(self, world: int) -> list[dict]:
        self[world] = _run(self.init_dir, self.base / f"world{world}", world)
        return self[world]


# EQUIV_WORLDS=1: the one-rank job only (tests/equivalence/mutants.py, to save time); both by default.
WORLDS = tuple(int(w) for w in os.environ.get("EQUIV_WORLDS", "1,2").split(","))
PARAMS = [pytest.param(w, c, id=f"{c}-{w}rank") for w, c in itertools.product(WORLDS, CASES)]


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


def assert_weights_close(diff: dict) -> None:
    """Every parameter within W_REL of its own largest value; the key biases (zero gradient in exact
    arithmetic, AdamW's normalised rounding noise: harness._pieces) within KEY_BIAS_ABS absolute."""
    assert diff["relative"] < W_REL, diff
    assert diff["key_bias_abs"] < KEY_BIAS_ABS, diff


@pytest.mark.parametrize("world,case", PARAMS)
def test_final_weights_are_hfs(runs, world, case):
    for rank in runs[world]:
        assert_weights_close(rank[case]["ours"]["weights_vs_hf"])


def assert_grad_norms_equal(ours: list, hf: list) -> None:
    assert None not in hf and None not in ours, (ours, hf)  # logged at every logging step
    assert ours == pytest.approx(hf, rel=REL)


@pytest.mark.parametrize("world,case", PARAMS)
def test_grad_norm_is_logged_at_every_logging_step_as_hfs(runs, world, case):
    # The gradient norm before clipping: where the loss scale or a gradient's factor goes wrong, it shows
    # here even when the clip and AdamW would hide it from the losses.
    entry = runs[world][0][case]
    hf, ours = entry["hf"], entry["ours"]
    assert len(ours["grad_norm"]) == len(ours["step"]) == hf["global_step"]
    assert_grad_norms_equal(ours["grad_norm"], hf["grad_norm"])
    assert min(hf["grad_norm"]) > SETTINGS_CLIP  # this run's clip binds at every step
    start = entry["resumed"]["from_step"]
    assert_grad_norms_equal(entry["resumed"]["grad_norm"], hf["grad_norm"][start:])


@pytest.mark.parametrize("world,case", PARAMS)
def test_resumed_run_goes_on_as_hfs_unbroken_run(runs, world, case):
    # Resumed one step into the second epoch (batches skipped by index), to the end.
    entry = runs[world][0][case]
    hf, resumed = entry["hf"], entry["resumed"]
    start = resumed["from_step"]
    assert resumed["step"] == hf["step"][start:]
    assert resumed["loss"] == pytest.approx(hf["loss"][start:], rel=REL)
    assert resumed["eval_loss"] == pytest.approx(hf["eval_loss"][-1:], rel=REL)


@pytest.mark.parametrize("world", WORLDS)
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


@pytest.mark.parametrize("world", WORLDS)
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


@pytest.mark.parametrize("world", WORLDS)
def test_fast_ddp_gives_hfs_numbers_too(runs, world):
    entry = runs[world][0]["gpt2"]
    assert entry["fast_ddp"]["loss"] == pytest.approx(entry["hf"]["loss"], rel=REL)
    assert entry["fast_ddp"]["eval_loss"] == pytest.approx(entry["hf"]["eval_loss"], rel=REL)
    assert_grad_norms_equal(entry["fast_ddp"]["grad_norm"], entry["hf"]["grad_norm"])
    assert_weights_close(entry["fast_ddp"]["weights_vs_hf"])


def assert_same_run(ours: dict, hf: dict) -> None:
    assert ours["step"] == hf["step"]
    assert ours["loss"] == pytest.approx(hf["loss"], rel=REL)
    assert ours["lr"] == pytest.approx(hf["lr"], rel=REL, abs=1e-12)
    assert_grad_norms_equal(ours["grad_norm"], hf["grad_norm"])
    assert ours["eval_loss"] == pytest.approx(hf["eval_loss"], rel=REL)
    assert_weights_close(ours["weights_vs_hf"])


@pytest.mark.parametrize("world", WORLDS)
def test_without_clipping_the_gradient_scale_shows_in_losses_and_weights(runs, world):
    # max_grad_norm 0: nothing rescales the gradients, so a wrong loss scale (gradients x2, the loss not
    # divided over the step's tokens) moves grad_norm by its factor, and the weights through AdamW's eps.
    hf, ours = runs[world][0]["gpt2"]["noclip"]["hf"], runs[world][0]["gpt2"]["noclip"]["ours"]
    assert len(ours["grad_norm"]) == hf["global_step"]
    assert_same_run(ours, hf)


@pytest.mark.parametrize("world", WORLDS)
def test_dropout_draws_the_same_random_numbers_as_hf_and_resumes_exactly(runs, world):
    # GPT-2 with dropout 0.1 (its real config's): the loaders draw their seeds from the global RNG as
    # transformers' do, so dropout's masks are HF's; a run resumed one step into the second epoch restores
    # the RNG after building its iterator (Trainer._run_epoch's order) and goes on with HF's numbers.
    entry = runs[world][0]["gpt2"]["dropout"]
    hf, ours, resumed = entry["hf"], entry["ours"], entry["resumed"]
    assert_same_run(ours, hf)
    assert ours["loss"] != pytest.approx(runs[world][0]["gpt2"]["hf"]["loss"], rel=1e-3)  # dropout acted
    start = resumed["from_step"]
    assert resumed["step"] == hf["step"][start:]
    assert resumed["loss"] == pytest.approx(hf["loss"][start:], rel=REL)
    assert_grad_norms_equal(resumed["grad_norm"], hf["grad_norm"][start:])


@pytest.mark.parametrize("world", WORLDS)
def test_bf16_autocast_gives_hfs_numbers(runs, world):
    # --bf16 on the CPU: autocast bf16 on both sides, with --fused_kernels at its default (on): under bf16
    # the Trainer keeps GPT-2's own gelu (the fused kernel rounds once where gelu_new rounds after each of
    # its ops: measured 2e-5 on the losses, 3e-4 on grad_norm, 4e-2 on a weight). Same tolerance as fp32.
    entry = runs[world][0]["gpt2"]["bf16"]
    assert_same_run(entry["ours"], entry["hf"])
    # bf16 acted: on this tiny model it moves the losses by about 3e-5 and grad_norm by about 1e-3 against fp32.
    assert entry["ours"]["grad_norm"] != pytest.approx(runs[world][0]["gpt2"]["hf"]["grad_norm"], rel=1e-4)


def _after(run: dict, start: int) -> dict:
    """The logs of a resumed run after step `start` (transformers' log_history also holds the checkpoint's)."""
    keep = [i for i, step in enumerate(run["step"]) if step > start]
    return {key: [run[key][i] for i in keep] for key in ("step", "loss", "grad_norm", "lr")}


@pytest.mark.parametrize("world", WORLDS)
def test_checkpoints_are_interchangeable_with_transformers_trainer(runs, world):
    # Ours in transformers' layout: its Trainer resumes from our checkpoint-N and goes on with the unbroken
    # run's numbers; ours resumes from its checkpoint-N (no gaudi_launch_state.json there: the position
    # follows from the step, as transformers derives it) and does the same.
    entry = runs[world][0]["gpt2"]
    hf = entry["hf"]
    for name in ("hf_resumes_ours", "ours_resumes_hf"):
        resumed = entry[name]
        start = resumed["from_step"]
        got, want = _after(resumed, start), _after(hf, start)
        assert got["step"] == want["step"] == list(range(start + 1, hf["global_step"] + 1)), name
        assert got["loss"] == pytest.approx(want["loss"], rel=REL), name
        assert_grad_norms_equal(got["grad_norm"], want["grad_norm"])
        assert resumed["eval_loss"][-1:] == pytest.approx(hf["eval_loss"][-1:], rel=REL), name
    files = set(entry["checkpoint_files"])
    suffix = "rng_state.pth" if world == 1 else "rng_state_0.pth"
    assert {"config.json", "model.safetensors", "optimizer.pt", "scheduler.pt", suffix} <= files
    assert {"trainer_state.json", "gaudi_launch_state.json"} <= files


def test_a_checkpoint_loads_with_from_pretrained_and_its_state_with_transformers(init_dir, tmp_path):
    # checkpoint-N is a model directory (from_pretrained) and its trainer_state.json is transformers'
    # TrainerState (load_from_json refuses a key it does not know).
    sys.path.insert(0, str(ROOT))
    from transformers import AutoModelForCausalLM
    from transformers.trainer_callback import TrainerState

    from tests.equivalence.harness import run_ours

    trainer, _ = run_ours(str(init_dir), str(tmp_path / "out"), "gpt2", save_steps=4, max_steps=4)
    path = tmp_path / "out" / "checkpoint-4"
    loaded = AutoModelForCausalLM.from_pretrained(str(path))
    for (name, a), (_, b) in zip(loaded.named_parameters(), trainer.model.named_parameters()):
        assert torch.equal(a, b), name
    state = TrainerState.load_from_json(str(path / "trainer_state.json"))
    assert state.global_step == 4 and state.max_steps == 4
    assert [row["step"] for row in state.log_history if "loss" in row] == [1, 2, 3, 4]
