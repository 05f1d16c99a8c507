"""DeepSpeed configs with "auto" values filled from the training arguments (runtime/ds_config.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gaudi_launch.runtime.args import TrainingArguments
from gaudi_launch.runtime.ds_config import DeepSpeedConfigError, load_ds_config, resolve_ds_config, zero_stage

ROOT = Path(__file__).resolve().parents[2]

ZERO3 = {
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto",
    "bf16": {"enabled": "auto"},
    "gradient_clipping": "auto",
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": 0.1}},
    "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": "auto", "total_num_steps": "auto"}},
    "zero_optimization": {
        "stage": 3,
        "reduce_bucket_size": "auto",
        "stage3_prefetch_bucket_size": "auto",
        "stage3_param_persistence_threshold": "auto",
    },
}


def test_auto_values_come_from_the_training_arguments_and_written_values_stand():
    args = TrainingArguments(
        per_device_train_batch_size=4,
        gradient_accumulation_steps=3,
        bf16=True,
        max_grad_norm=0.5,
        learning_rate=2e-4,
        adam_epsilon=1e-8,
        weight_decay=0.1,  # the config's written value: it agrees
        warmup_steps=7,
    )
    out = resolve_ds_config(ZERO3, args, world=8, total_steps=100, hidden_size=16)
    assert (out["train_micro_batch_size_per_gpu"], out["gradient_accumulation_steps"], out["train_batch_size"]) == (
        4,
        3,
        96,
    )
    assert out["bf16"]["enabled"] is True and out["gradient_clipping"] == 0.5
    assert out["optimizer"]["params"] == {"lr": 2e-4, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.1}
    assert out["scheduler"]["params"] == {"warmup_num_steps": 7, "total_num_steps": 100}
    assert out["zero_optimization"]["reduce_bucket_size"] == 256
    assert "zero_allow_untested_optimizer" not in out  # DeepSpeed builds the optimizer itself
    assert ZERO3["train_batch_size"] == "auto"  # the caller's dict is untouched


def test_an_auto_nothing_can_fill_is_an_error_naming_it():
    config = dict(ZERO3)
    with pytest.raises(ValueError, match="zero_optimization.reduce_bucket_size"):
        resolve_ds_config(config, TrainingArguments(weight_decay=0.1), world=1, total_steps=1, hidden_size=None)


def test_sizes_that_disagree_with_the_arguments_are_refused():
    with pytest.raises(ValueError, match="gradient_accumulation_steps is 4 but --gradient_accumulation_steps is 1"):
        resolve_ds_config({"gradient_accumulation_steps": 4}, TrainingArguments(), world=1, total_steps=1)


def test_every_value_that_contradicts_a_flag_is_refused_and_listed():
    # As transformers' HfTrainerDeepSpeedConfig (fill_match, trainer_config_finalize): DeepSpeed would train
    # with the config's clip, rate, betas, eps, decay, precision, batch and schedule while the flags say
    # otherwise; every mismatch is named in one error, before any training.
    config = {
        "train_batch_size": 64,
        "gradient_clipping": 1.0,
        "bf16": {"enabled": True},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}},
        "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 10, "total_num_steps": 500}},
    }
    args = TrainingArguments(per_device_train_batch_size=4, max_grad_norm=0.5, learning_rate=2e-4, warmup_steps=3)
    with pytest.raises(DeepSpeedConfigError) as err:
        resolve_ds_config(config, args, world=2, total_steps=100)
    lines = str(err.value).splitlines()
    named = {line.split()[0] for line in lines[1:-1]}
    assert named == {
        "train_batch_size",
        "gradient_clipping",
        "bf16.enabled",
        "optimizer.params.lr",
        "optimizer.params.betas",
        "optimizer.params.eps",
        "optimizer.params.weight_decay",
        "scheduler.params.warmup_num_steps",
        "scheduler.params.total_num_steps",
    }
    assert "  gradient_clipping is 1.0 but --max_grad_norm is 0.5" in lines
    assert "  train_batch_size is 64 but the batch x accumulation x 2 ranks is 8" in lines
    assert 'write "auto"' in lines[-1]
    # The same values as the flags, or "auto": accepted.
    agreeing = TrainingArguments(
        per_device_train_batch_size=32,
        max_grad_norm=1.0,
        bf16=True,
        learning_rate=1e-3,
        adam_beta2=0.95,
        adam_epsilon=1e-8,
        weight_decay=0.1,
        warmup_steps=10,
    )
    assert resolve_ds_config(config, agreeing, world=2, total_steps=500)["train_batch_size"] == 64


def test_run_clm_refuses_a_contradicting_config_before_training(tmp_path):
    import subprocess
    import sys

    config = tmp_path / "ds.json"
    config.write_text(json.dumps({"gradient_clipping": 2.0, "zero_optimization": {"stage": 1}}))
    out = tmp_path / "out"
    res = subprocess.run(
        [
            sys.executable,
            "scripts/run_clm.py",
            "--do_train",
            "--device",
            "cpu",
            "--output_dir",
            str(out),
            "--deepspeed",
            str(config),
            "--max_steps",
            "2",
            "--max_grad_norm",
            "1.0",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "DS_ACCELERATOR": "cpu"},
        cwd=ROOT,
    )
    assert res.returncode == 2, res.stderr[-3000:]
    assert "gradient_clipping is 2.0 but --max_grad_norm is 1.0" in res.stderr
    assert "Traceback" not in res.stderr
    assert not (out / "metrics.jsonl").exists() or "loss" not in (out / "metrics.jsonl").read_text()


def test_without_an_optimizer_block_ours_is_handed_over():
    out = resolve_ds_config({"zero_optimization": {"stage": 2}}, TrainingArguments(), world=1, total_steps=1)
    assert out["zero_allow_untested_optimizer"] is True


def test_a_config_that_does_not_load_names_the_file_and_line(tmp_path):
    bad = tmp_path / "ds.json"
    bad.write_text('{\n  "train_batch_size": auto\n}')
    with pytest.raises(ValueError, match=rf"{bad}:2: not valid JSON"):
        load_ds_config(str(bad))
    with pytest.raises(ValueError, match="cannot read it"):
        load_ds_config(str(tmp_path / "missing.json"))
    good = tmp_path / "ok.json"
    good.write_text(json.dumps({"a": 1}))
    assert load_ds_config(str(good)) == {"a": 1}


def test_before_the_model_exists_only_what_the_arguments_decide_is_filled():
    # prepare_deepspeed's config for zero.Init (as transformers' trainer_config_process): batch sizes and
    # precision now; the schedule's length and the model's sizes stay "auto" (DeepSpeed's defaults) and
    # are no error yet.
    args = TrainingArguments(per_device_train_batch_size=4, gradient_accumulation_steps=3, bf16=True, weight_decay=0.1)
    out = resolve_ds_config(ZERO3, args, world=2, total_steps=None, hidden_size=None, complete=False)
    assert (out["train_batch_size"], out["bf16"]["enabled"]) == (24, True)
    assert out["scheduler"]["params"] == {"warmup_num_steps": "auto", "total_num_steps": "auto"}
    assert out["zero_optimization"]["reduce_bucket_size"] == "auto"
    assert zero_stage(out) == 3 and zero_stage({}) == 0 and zero_stage({"zero_optimization": {"stage": 1}}) == 1
