"""The Trainer on CPU for real, and its HPU call sequence against the recording stand-in."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from gaudi_launch.runtime.args import GaudiConfig, TrainingArguments
from gaudi_launch.runtime.trainer import Trainer, enable_checkpointing, multi_node_eval_warning

ROOT = Path(__file__).resolve().parents[2]

# A tiny deterministic regression task; dropout makes RNG state matter for exact resumes.
TASK = textwrap.dedent("""
    import torch

    class Reg(torch.nn.Module):
        def __init__(self, slow_first=0.0):
            super().__init__()
            self.lin1 = torch.nn.Linear(8, 16)
            self.drop = torch.nn.Dropout(0.2)
            self.lin2 = torch.nn.Linear(16, 1)
            self.slow_first = slow_first

        def forward(self, x, y):
            if self.slow_first:
                import time
                time.sleep(self.slow_first)  # a deliberately slow first step (like graph compilation)
                self.slow_first = 0.0
            out = self.lin2(self.drop(torch.relu(self.lin1(x)))).squeeze(-1)
            return {"loss": torch.nn.functional.mse_loss(out, y)}

    def dataset(n=96):
        g = torch.Generator().manual_seed(0)
        x = torch.randn(n, 8, generator=g)
        y = x @ torch.linspace(-1, 1, 8) + 0.1 * torch.randn(n, generator=g)
        return [{"x": x[i], "y": y[i]} for i in range(n)]

    def model(seed=0, slow_first=0.0):
        torch.manual_seed(seed)
        return Reg(slow_first)
""")
ns: dict = {}
exec(TASK, ns)


def args(tmp_path, **kw) -> TrainingArguments:
    base = dict(
        output_dir=str(tmp_path),
        per_device_train_batch_size=8,
        learning_rate=1e-2,
        max_steps=30,
        logging_steps=1,
        save_steps=0,
        device="cpu",
        seed=3,
    )
    base.update(kw)
    return TrainingArguments(**base)


def losses(output_dir) -> list:
    rows = [json.loads(line) for line in Path(output_dir, "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss"]) for r in rows if "loss" in r]


def test_training_lowers_the_loss_on_cpu(tmp_path):
    trainer = Trainer(
        ns["model"](),
        args(tmp_path, learning_rate=5e-2, max_steps=40),
        train_dataset=ns["dataset"](),
        log=lambda s: None,
    )
    out = trainer.train()
    curve = [loss for _, loss in losses(tmp_path)]
    assert out.global_step == 40 and len(curve) == 40
    assert sum(curve[-10:]) / 10 < 0.5 * sum(curve[:10]) / 10
    assert out.metrics["measured_steps"] == 40


@pytest.mark.parametrize("warmup, expected", [(0, 52), (2, 52 - 2 * 6)])
def test_throughput_counts_the_samples_trained(tmp_path, warmup, expected):
    # 26 samples in batches of 2, accumulation 3: each epoch is 4 steps of 6 samples and a short one of 2.
    # transformers counts 26 a epoch (Trainer.num_examples x epochs), optimum-habana leaves out the warm-up
    # steps' samples; a full batch x accumulation per step would count 60.
    trainer = Trainer(
        ns["model"](),
        args(
            tmp_path,
            per_device_train_batch_size=2,
            gradient_accumulation_steps=3,
            max_steps=-1,
            num_train_epochs=2,
            throughput_warmup_steps=warmup,
        ),
        train_dataset=ns["dataset"](26),
        tokens_per_sample=4,
        log=lambda s: None,
    )
    out = trainer.train()
    assert out.global_step == 10
    assert out.metrics["measured_samples"] == expected
    rate = out.metrics["train_samples_per_second"]
    assert out.metrics["train_tokens_per_second"] == pytest.approx(4 * rate)


def test_samples_in_round_counts_each_sample_once():
    from gaudi_launch.runtime.sampling import batches_per_rank, samples_in_round

    for n, batch, world in ((26, 2, 1), (26, 2, 2), (7, 2, 2), (9, 4, 3)):
        rounds = batches_per_rank(n, batch, world)
        assert sum(samples_in_round(n, batch, world, i) for i in range(rounds)) == n
    assert samples_in_round(26, 2, 2, 6) == 2  # the last round: 2 left, 2 completed from the start not counted
    assert samples_in_round(26, 4, 2, 2, drop_last=True) == 8


def _no_dropout(model):
    model.drop.p = 0.0
    return model


@pytest.mark.parametrize(
    "strategy, extra, expected",
    [
        ("steps", {"eval_steps": 5}, [5, 10, 15]),
        ("steps", {"logging_steps": 4}, [4, 8, 12]),  # eval_steps defaults to logging_steps
        ("epoch", {}, [6, 12, 18]),  # 48 samples / batch 8 = 6 steps an epoch; the last epoch's end too
    ],
)
def test_evaluation_during_training_leaves_training_unchanged(tmp_path, strategy, extra, expected):
    data = ns["dataset"](48)
    kw = dict(max_steps=-1, num_train_epochs=3 if strategy == "epoch" else 1, **extra)
    if strategy == "steps":
        kw.update(max_steps=15 if "eval_steps" in extra else 12)
    plain_kw = {k: v for k, v in kw.items() if k != "eval_steps"}
    # Without dropout: an evaluation draws one number from the global RNG (its loader's seed, as
    # transformers' does: the equivalence suite's dropout case), which only dropout would see.
    plain = Trainer(
        _no_dropout(ns["model"]()), args(tmp_path / "plain", **plain_kw), train_dataset=data, log=lambda s: None
    )
    plain.train()
    evaluated = Trainer(
        _no_dropout(ns["model"]()),
        args(tmp_path / "eval", eval_strategy=strategy, **kw),
        train_dataset=data,
        eval_dataset=ns["dataset"](16),
        log=lambda s: None,
    )
    out = evaluated.train()
    rows = [json.loads(line) for line in Path(tmp_path / "eval", "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "eval_loss" in r] == expected
    assert out.global_step == expected[-1]
    assert losses(tmp_path / "eval") == losses(tmp_path / "plain")  # no weight change


def test_eval_strategy_arguments():
    assert TrainingArguments(evaluation_strategy="steps", logging_steps=7).eval_steps == 7  # older name
    assert TrainingArguments(eval_strategy="steps", eval_steps=3).eval_steps == 3
    with pytest.warns(UserWarning, match="--eval_steps 50 has no effect with --eval_strategy no"):
        TrainingArguments(eval_steps=50)


def test_throughput_excludes_a_slow_warmup_step(tmp_path):
    data = ns["dataset"]()
    timed = {}
    for warmup in (0, 1):
        start = time.perf_counter()
        trainer = Trainer(
            ns["model"](slow_first=1.5),
            args(tmp_path / str(warmup), max_steps=6, throughput_warmup_steps=warmup),
            train_dataset=data,
            log=lambda s: None,
        )
        out = trainer.train()
        timed[warmup] = (out.metrics, time.perf_counter() - start)
    with_slow, _ = timed[0]
    without_slow, _ = timed[1]
    assert with_slow["measured_steps"] == 6 and without_slow["measured_steps"] == 5
    # The warm-up run's rate is computed from the fast steps only: it cannot be dragged down by the
    # 1.5 s first step, so it is above what 48 samples over the whole run would give.
    assert without_slow["train_samples_per_second"] > 48 / with_slow["train_runtime"]
    assert without_slow["train_samples_per_second"] > with_slow["train_samples_per_second"]


RUN = textwrap.dedent("""
    import os, sys, torch
    sys.path.insert(0, {root!r})
    {task}
    from gaudi_launch.runtime.args import TrainingArguments
    from gaudi_launch.runtime.trainer import Trainer, enable_checkpointing
    crash_step = int(os.environ.get("CRASH_STEP", "0"))
    if os.environ.get("CRASH_IN_SAVE"):
        real_save = torch.save
        def save(obj, f, *a, **k):
            name = getattr(f, "name", f)
            if str(name).endswith("optimizer.pt") and "-{{}}-".format(crash_step) in str(name):
                os._exit(9)  # killed in the middle of writing a checkpoint
            return real_save(obj, f, *a, **k)
        torch.save = save
    def on_step(step):
        if crash_step and step == crash_step and not os.environ.get("CRASH_IN_SAVE"):
            os._exit(9)  # killed right after this optimizer step
    a = TrainingArguments(output_dir=sys.argv[1], per_device_train_batch_size=8, learning_rate=1e-2,
                          max_steps=24, logging_steps=1, save_steps=4, save_total_limit=2, device="cpu", seed=3,
                          resume_from_checkpoint="latest" if len(sys.argv) > 2 else None)
    Trainer(model(), a, train_dataset=dataset(), log=lambda s: None, on_step_end=on_step).train()
""")


def run_script(tmp_path, out_dir, *extra, env=None):
    script = tmp_path / "run.py"
    script.write_text(RUN.format(root=str(ROOT), task=TASK))
    return subprocess.run(
        [sys.executable, str(script), str(out_dir), *extra],
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    "crash",
    [{"CRASH_STEP": "11"}, {"CRASH_STEP": "16", "CRASH_IN_SAVE": "1"}],
    ids=["killed-between-saves", "killed-during-a-save"],
)
def test_killed_run_resumes_and_reproduces_the_loss_curve_exactly(tmp_path, crash):
    ref = run_script(tmp_path, tmp_path / "ref")
    assert ref.returncode == 0, ref.stderr
    crashed = run_script(tmp_path, tmp_path / "crash", env=crash)
    assert crashed.returncode == 9
    saved = sorted(p.name for p in (tmp_path / "crash").iterdir() if p.name.startswith("checkpoint-"))
    assert saved == (
        ["checkpoint-4", "checkpoint-8"] if crash["CRASH_STEP"] == "11" else ["checkpoint-12", "checkpoint-8"]
    )
    resumed = run_script(tmp_path, tmp_path / "crash", "resume")
    assert resumed.returncode == 0, resumed.stderr
    reference = dict(losses(tmp_path / "ref"))
    after = dict(losses(tmp_path / "crash"))  # resumed steps overwrite the replayed ones
    assert sorted(after) == list(range(1, 25))
    assert after == reference  # bit-for-bit the same curve


def test_gradient_checkpointing_saves_activation_memory():
    import transformers

    from gaudi_launch.runtime.data import ASSETS

    config = transformers.AutoConfig.from_pretrained(os.path.join(ASSETS, "small-gpt2"))
    saved_bytes = {}
    for checkpointing in (False, True):
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(config)
        model.train()
        if checkpointing:
            enable_checkpointing(model)
        ids = torch.randint(0, config.vocab_size, (4, 128))
        total = [0]

        def pack(t):
            total[0] += t.numel() * t.element_size()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        saved_bytes[checkpointing] = total[0]
    assert saved_bytes[True] < 0.6 * saved_bytes[False], saved_bytes


def test_stand_in_hpu_call_order_lazy_mode_pipelining_graphs_and_fused_ops(hpu_stand_in, tmp_path):
    calls = hpu_stand_in
    gaudi = GaudiConfig(use_fused_adam=True, use_fused_clip_norm=True)
    a = args(
        tmp_path,
        device=None,
        max_steps=2,
        use_hpu_graphs_for_training=True,
        pipelining_fwd_bwd=True,
        throughput_warmup_steps=1,
        use_lazy_mode=True,
    )
    trainer = Trainer(ns["model"](), a, train_dataset=ns["dataset"](32), gaudi_config=gaudi, log=lambda s: None)
    assert trainer.info.kind == "hpu" and trainer.info.lazy
    start = len(calls)
    trainer.train()
    seq = [name for name, _ in calls[start:] if name in ("mark_step", "FusedAdamW.step", "FusedClipNorm.clip_norm")]
    # Per optimizer step: pipelining mark_step between loss and backward, one after backward,
    # fused clip (which marks a step before and after itself), fused AdamW (one mark before each of
    # its two parameter groups and one after), then one after the optimizer step + zero_grad.
    one_step = [
        "mark_step",
        "mark_step",
        "FusedClipNorm.clip_norm",
        "mark_step",
        "mark_step",
        "FusedAdamW.step",
        "mark_step",
        "mark_step",
        "mark_step",
        "mark_step",
    ]
    assert seq == one_step * 2
    names = [name for name, _ in calls]
    assert "ModuleCacher" in names and "FusedAdamW" in names
    assert any(n == "core.import" and d["PT_HPU_LAZY_MODE"] == "1" for n, d in calls)
    assert "memory_stats" in names  # logged every logging_steps from the device


def test_stand_in_hpu_pads_the_last_batch_in_lazy_mode(hpu_stand_in, tmp_path):
    a = args(tmp_path, device=None, max_steps=-1, num_train_epochs=1, per_device_train_batch_size=8)
    trainer = Trainer(ns["model"](), a, train_dataset=ns["dataset"](20), log=lambda s: None)
    loader = trainer.train_dataloader()
    assert [len(b["y"]) for b in loader] == [8, 8, 8]  # 20 samples padded to whole batches (static shapes)
    cpu = Trainer(
        ns["model"](),
        args(tmp_path / "cpu", per_device_train_batch_size=8),
        train_dataset=ns["dataset"](20),
        log=lambda s: None,
    )
    assert [len(b["y"]) for b in cpu.train_dataloader()] == [8, 8, 4]


def test_stand_in_hpu_lazy_mode_adds_no_mark_step_to_recomputation(hpu_stand_in, tmp_path):
    # Non-reentrant checkpointing (which optimum-habana forces) needs none: a mark_step per
    # recomputed block only cut the backward graph into pieces.
    import transformers

    from gaudi_launch.runtime.data import ASSETS

    config = transformers.AutoConfig.from_pretrained(os.path.join(ASSETS, "tiny-gpt2"))
    data = [{"input_ids": ids, "labels": ids} for ids in torch.randint(0, config.vocab_size, (16, 32))]
    counts = {}
    for checkpointing in (False, True):
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(config)
        a = args(tmp_path / str(checkpointing), device=None, max_steps=2, gradient_checkpointing=checkpointing)
        trainer = Trainer(model, a, train_dataset=data, log=lambda s: None)
        start = len(hpu_stand_in)
        trainer.train()
        counts[checkpointing] = sum(1 for name, _ in hpu_stand_in[start:] if name == "mark_step")
    assert counts[True] == counts[False] == 2 * 2  # per step: after backward, after the optimizer step


def test_stand_in_hpu_present_but_device_option_forces_cpu(hpu_stand_in, monkeypatch):
    from gaudi_launch.runtime.device import select_device

    monkeypatch.setenv("GAUDI_LAUNCH_DEVICE", "cpu")  # what `gaudi-launch --device cpu` gives every rank
    info = select_device(TrainingArguments())
    assert (info.kind, info.dist_backend) == ("cpu", "gloo")
    assert select_device(TrainingArguments(device="hpu")).kind == "hpu"  # the script's own choice wins


def test_multi_node_evaluation_gets_the_guides_advice():
    assert multi_node_eval_warning(8, 8) is None and multi_node_eval_warning(1, 1) is None
    note = multi_node_eval_warning(16, 8)
    assert "not recommended" in note and "inconsistent results" in note
    assert "--model_name_or_path <output_dir> --do_eval" in note


def test_save_model_writes_weights_that_load_back(tmp_path):
    model = ns["model"]()
    trainer = Trainer(model, args(tmp_path, max_steps=2), train_dataset=ns["dataset"](16), log=lambda s: None)
    trainer.train()
    path = trainer.save_model(str(tmp_path / "final"))
    state = torch.load(os.path.join(path, "pytorch_model.bin"))
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())


TWO_RANKS = TASK + textwrap.dedent("""
    import json, os, sys
    from gaudi_launch.runtime.args import TrainingArguments
    from gaudi_launch.runtime.trainer import Trainer

    curves = {}
    for strategy in ("ddp", "fast_ddp"):
        out = os.path.join(sys.argv[1], strategy)
        args = TrainingArguments(output_dir=out, per_device_train_batch_size=8, learning_rate=5e-2, max_steps=12,
                                 logging_steps=1, save_steps=0, device="cpu", seed=3, max_grad_norm=0.05,
                                 distribution_strategy=strategy)
        trainer = Trainer(model(), args, train_dataset=dataset(), log=lambda s: None)
        trainer.train()
        if strategy == "fast_ddp":
            flat = trainer.fast_ddp.flat_gradients()
            views = flat is not None and all(
                p.grad.untyped_storage().data_ptr() == flat.untyped_storage().data_ptr()
                for p in trainer.model.parameters())
        if int(os.environ["RANK"]) == 0:
            rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
            curves[strategy] = [r["loss"] for r in rows if "loss" in r]
        del trainer
    print("RESULT " + json.dumps({"rank": os.environ["RANK"], "curves": curves, "views": views}), flush=True)
""")


def two_rank_results(tmp_path, source: str) -> list:
    """Run ``source`` on 2 CPU ranks through gaudi-launch (its first argument: tmp_path); each rank's
    ``RESULT {json}`` line, parsed."""
    script = tmp_path / "two_ranks.py"
    script.write_text(source)
    res = subprocess.run(
        [sys.executable, "-m", "gaudi_launch", "--num_devices", "2", str(script), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=str(ROOT),
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return [json.loads(line.split("RESULT ", 1)[1]) for line in res.stdout.splitlines() if "RESULT " in line]


def test_two_rank_fast_ddp_with_clipping_trains_as_ddp_does(tmp_path):
    # fast_ddp off HPU: gradients are views of its buffer and clipped there at once; the loss curve
    # is DDP's (the clip binds: max_grad_norm 0.05).
    results = two_rank_results(tmp_path, TWO_RANKS)
    assert len(results) == 2 and all(r["views"] for r in results)
    curves = next(r["curves"] for r in results if r["rank"] == "0")
    assert len(curves["ddp"]) == len(curves["fast_ddp"]) == 12
    assert curves["fast_ddp"] == pytest.approx(curves["ddp"], abs=2e-4)  # the log rounds to 4 places
    assert curves["fast_ddp"][-1] < curves["fast_ddp"][0]


class _LossIsY(torch.nn.Module):
    """A model whose training losses are `train_losses` in turn and whose eval loss is its batch's y: a nan
    loss, and no nan gradient."""

    def __init__(self, train_losses):
        super().__init__()
        self.p = torch.nn.Parameter(torch.zeros(1))
        self.train_losses = list(train_losses)

    def forward(self, x, y):
        value = torch.tensor(self.train_losses.pop(0)) if self.training else y.mean()
        return {"loss": self.p.sum() * 0 + value}


def test_nan_losses_are_filtered_as_transformers_filters_them(tmp_path):
    # transformers (logging_nan_inf_filter): a nan/inf micro-batch loss counts as the mean per
    # step since the last log (Trainer._run_epoch); an eval batch's nan loss is left out of eval_loss
    # (evaluation_loop); perplexity is exp(eval_loss), inf where it overflows (run_clm.py).
    ys = [2.0, float("nan"), 4.0, 6.0]
    items = [{"x": torch.zeros(1), "y": torch.tensor(y)} for y in ys]
    targs = args(
        tmp_path,
        per_device_train_batch_size=1,
        per_device_eval_batch_size=1,
        max_steps=4,
        logging_steps=2,
        logging_nan_inf_filter=True,  # transformers' default; optimum-habana's is False
    )
    trainer = Trainer(_LossIsY(ys), targs, train_dataset=items, eval_dataset=items, log=lambda s: None)
    trainer.train()
    logged = [loss for _, loss in losses(tmp_path)]
    assert logged == pytest.approx([(2.0 + 2.0 / 2) / 2, (4.0 + 6.0) / 2])
    metrics = trainer.evaluate()
    assert metrics["eval_loss"] == pytest.approx(4.0)  # (2 + 4 + 6) / 3
    from gaudi_launch.runtime.trainer import perplexity

    assert perplexity(800.0) == float("inf") and perplexity(1.0) == pytest.approx(2.718281828)


def test_fractional_logging_and_warmup_steps_and_defaults_are_transformers_5s(tmp_path):
    from transformers import TrainingArguments as HFArgs

    from gaudi_launch.runtime.args import warmup_steps

    hf = HFArgs(output_dir=str(tmp_path), warmup_steps=0.3)
    ours = TrainingArguments(output_dir=str(tmp_path), warmup_steps=0.3)
    for total in (1, 7, 10, 33):
        assert warmup_steps(ours, total) == hf.get_warmup_steps(total)
    assert TrainingArguments().logging_steps == HFArgs(output_dir=str(tmp_path)).logging_steps == 500
    with pytest.raises(ValueError, match="integer if bigger than 1"):
        TrainingArguments(logging_steps=2.5)
    # logging_steps 0.25 of 8 steps: every 2 (TrainerState.compute_steps rounds up).
    trainer = Trainer(
        ns["model"](),
        args(tmp_path, max_steps=8, logging_steps=0.25),
        train_dataset=ns["dataset"](),
        log=lambda s: None,
    )
    trainer.train()
    assert [step for step, _ in losses(tmp_path)] == [2, 4, 6, 8]
