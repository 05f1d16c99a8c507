"""The main job: run_clm trains the shipped tiny GPT-2 through gaudi-launch on 2 CPU ranks."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_run_clm_two_ranks_lowers_eval_perplexity(tmp_path):
    out = tmp_path / "clm"
    cmd = [
        sys.executable,
        "-m",
        "gaudi_launch",
        "--num_devices",
        "2",
        "--device",
        "cpu",
        os.path.join(ROOT, "scripts", "run_clm.py"),
        # the seed's flags (--use_habana: CPU only because --device cpu asks), with a model name
        # the offline machine cannot fetch
        "--model_name_or_path",
        "gpt2-xl",
        "--gaudi_config_name",
        "Habana/gpt2",
        "--do_train",
        "--do_eval",
        "--output_dir",
        str(out),
        "--learning_rate",
        "4e-03",
        "--per_device_train_batch_size",
        "8",
        "--gradient_checkpointing",
        "--num_train_epochs",
        "1",
        "--use_habana",
        "--use_lazy_mode",
        "--throughput_warmup_steps",
        "3",
        "--logging_steps",
        "5",
        "--distribution_strategy",
        "fast_ddp",
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=str(tmp_path))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert results["eval"]["perplexity"] < 0.7 * results["eval_before"]["perplexity"]
    assert results["train"]["measured_steps"] == results["train"]["global_step"] - 3
    assert results["train"]["train_samples_per_second"] > 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    logged = [r for r in rows if "loss" in r]
    assert logged and all("max_memory_allocated (GB)" in r for r in logged)
    assert "[rank 0] step 5 | loss" in res.stdout and "[rank 1] step" not in res.stdout  # rank 0 logs
    # the notice about the model once (rank 0), and nothing of DeepSpeed, which this run does not use
    # (saving the model imported it through accelerate, and it warned it found no accelerator)
    assert (res.stdout + res.stderr).count("not a local directory and the hub is not reachable") == 1, res.stderr
    assert "[rank 0] run_clm: 'gpt2-xl' is not a local directory" in res.stderr
    assert "accelerator" not in res.stdout + res.stderr, res.stderr
    # The multi-node guide's second step: evaluate the saved model alone, on one process.
    alone = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "scripts", "run_clm.py"),
            "--model_name_or_path",
            str(out),
            "--do_eval",
            "--output_dir",
            str(tmp_path / "eval"),
            "--device",
            "cpu",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=str(tmp_path),
    )
    assert alone.returncode == 0, alone.stderr[-3000:]
    again = json.loads((tmp_path / "eval" / "results.json").read_text())
    assert "train" not in again and "not a local directory" not in alone.stderr
    assert abs(again["eval_before"]["perplexity"] / results["eval"]["perplexity"] - 1) < 0.02


def test_use_habana_without_a_gaudi_is_a_clear_error_before_training(tmp_path):
    res = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "scripts", "run_clm.py"),
            "--use_habana",
            "--do_train",
            "--output_dir",
            str(tmp_path / "o"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 2
    assert "run_clm.py: error: device 'hpu' requested but habana_frameworks is not importable here" in res.stderr
    assert "--device cpu" in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / "o").exists()  # nothing trained, nothing written


def test_run_clm_with_deepspeed_zero_on_cpu(tmp_path):
    ds = tmp_path / "ds.json"
    ds.write_text(
        json.dumps(
            {
                "train_micro_batch_size_per_gpu": 8,
                "gradient_accumulation_steps": 1,
                "zero_optimization": {"stage": 2},
                "optimizer": {"type": "Adam", "params": {"lr": 4e-3, "torch_adam": True}},
            }
        )
    )
    out = tmp_path / "clm"
    cmd = [
        sys.executable,
        "-m",
        "gaudi_launch",
        "--num_devices",
        "2",
        os.path.join(ROOT, "scripts", "run_clm.py"),
        "--do_train",
        "--do_eval",
        "--output_dir",
        str(out),
        "--per_device_train_batch_size",
        "8",
        "--max_steps",
        "20",
        "--logging_steps",
        "5",
        "--learning_rate",  # as the config says: a value contradicting it is refused (transformers' rule)
        "4e-3",
        "--deepspeed",
        str(ds),
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=str(tmp_path))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert results["train"]["global_step"] == 20
    assert results["eval"]["perplexity"] < 0.8 * results["eval_before"]["perplexity"]
    lrs = [
        json.loads(line)["learning_rate"]
        for line in (out / "metrics.jsonl").read_text().splitlines()
        if "learning_rate" in line
    ]
    # Our schedule drives DeepSpeed's optimizer; each logged rate is the one its step used (as HF logs it):
    # linear to 0 after step 20, so steps 5 and 20 used 16/20 and 1/20 of the peak.
    assert lrs == sorted(lrs, reverse=True) and lrs[-1] == pytest.approx(lrs[0] / 16)


# optimum-habana's tests/configs/deepspeed_zero_2.json, as it ships: every size "auto", no optimizer block.
OPTIMUM_ZERO2 = {
    "steps_per_print": 1,
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto",
    "bf16": {"enabled": True},
    "gradient_clipping": 1.0,
    "zero_optimization": {"stage": 2, "overlap_comm": False, "reduce_scatter": False, "contiguous_gradients": False},
}


@pytest.mark.parametrize("blocks", ["as shipped", "with auto optimizer and scheduler blocks"])
def test_run_clm_with_optimum_habanas_zero2_config(tmp_path, blocks):
    config = dict(OPTIMUM_ZERO2)
    if blocks != "as shipped":
        config["optimizer"] = {
            "type": "AdamW",
            "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto", "torch_adam": True},
        }
        config["scheduler"] = {
            "type": "WarmupDecayLR",
            "params": {
                "warmup_min_lr": "auto",
                "warmup_max_lr": "auto",
                "warmup_num_steps": "auto",
                "total_num_steps": "auto",
            },
        }
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps(config))
    out = tmp_path / "clm"
    cmd = [
        sys.executable,
        "-m",
        "gaudi_launch",
        "--num_devices",
        "2",
        os.path.join(ROOT, "scripts", "run_clm.py"),
        "--do_train",
        "--do_eval",
        "--output_dir",
        str(out),
        "--per_device_train_batch_size",
        "4",
        "--gradient_accumulation_steps",
        "2",
        "--learning_rate",
        "4e-3",
        "--warmup_steps",
        "2",
        "--max_steps",
        "12",
        "--logging_steps",
        "2",
        "--bf16",
        "--deepspeed",
        str(ds),
        "--device",
        "cpu",
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=str(tmp_path))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert results["train"]["global_step"] == 12
    assert results["eval"]["perplexity"] < 0.9 * results["eval_before"]["perplexity"]
    lrs = [
        json.loads(line)["learning_rate"]
        for line in (out / "metrics.jsonl").read_text().splitlines()
        if "learning_rate" in line
    ]
    # "auto" took --learning_rate: the logged steps (2, 4, ...: the rates they used, as HF logs them) peak at
    # step 4, after the 2 warm-up steps: 0.9 of it on our linear schedule, all of it on DeepSpeed's WarmupDecayLR.
    assert 0.85 * 4e-3 <= max(lrs) <= 4e-3 * (1 + 1e-9)
    assert lrs[-1] < 0.35 * max(lrs)  # a decaying schedule over the 12 optimizer steps drove it


@pytest.mark.parametrize("strategy", ["ddp", "fast_ddp"])
def test_stand_in_hpu_run_clm_through_gaudi_launch_takes_every_gaudi_path(tmp_path, strategy):
    """The whole HPU path, launcher to kernel, against the recording habana_frameworks stand-in."""
    from tests.standin.fixture import STAND_IN_DIR

    cfg = tmp_path / "gaudi_config.json"
    cfg.write_text(
        json.dumps(
            {
                "use_torch_autocast": True,
                "use_fused_adam": True,
                "use_fused_clip_norm": True,
                "autocast_bf16_ops": ["addmm", "mm"],
                "autocast_fp32_ops": ["softmax"],
            }
        )
    )
    log = tmp_path / "calls"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PT_HPU_")}
    # DeepSpeed (imported by transformers' save_pretrained) would pick its own HPU accelerator on
    # seeing habana_frameworks: not ours to check, and beyond what the stand-in offers.
    env.update(PYTHONPATH=STAND_IN_DIR, HPU_STAND_IN_LOG=str(log), DS_ACCELERATOR="cpu")
    cmd = [
        sys.executable,
        "-m",
        "gaudi_launch",
        "--num_devices",
        "2",
        os.path.join(ROOT, "scripts", "run_clm.py"),
        "--gaudi_config_name",
        str(tmp_path),
        "--bf16",
        "--do_train",
        "--do_eval",
        "--output_dir",
        str(tmp_path / "out"),
        "--max_steps",
        "3",
        "--logging_steps",
        "1",
        "--per_device_train_batch_size",
        "4",
        "--max_train_samples",
        "32",
        "--max_eval_samples",
        "8",
        "--distribution_strategy",
        strategy,
        "--attn_implementation",
        "gaudi_fused_sdpa",
        "--use_hpu_graphs_for_training",
        "--pipelining_fwd_bwd",
        "--use_habana",
        "--use_lazy_mode",
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=str(tmp_path), env=env)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    n_layer = json.loads(
        open(os.path.join(ROOT, "gaudi_launch", "runtime", "assets", "tiny-gpt2", "config.json")).read()
    )["n_layer"]
    for rank in (0, 1):
        calls = json.loads((tmp_path / f"calls.rank{rank}.json").read_text())
        names = [name for name, _ in calls]
        (loaded,) = [details for name, details in calls if name == "core.import"]
        # The bridge found lazy mode and this job's op lists in place when it was loaded.
        assert loaded["PT_HPU_LAZY_MODE"] == "1"
        assert sorted(loaded["op_lists"].values()) == ["addmm\nmm\n", "softmax\n"]
        assert names.index("hccl.import") < names.index("hccl.create")  # registered by the worker
        assert "ModuleCacher" in names and "FusedAdamW" in names
        assert names.count("FusedClipNorm.clip_norm") == 3 and names.count("FusedAdamW.step") == 3
        # Between two optimizer steps: FusedAdamW's own (before each of its 2 groups, after the
        # update), one after the optimizer step + zero_grad; then the next step's marks between
        # loss and backward (pipelining), after backward, and FusedClipNorm's own before and after it.
        # fast_ddp adds none: its gradient packing replays two captured HPU graphs (as optimum-habana's).
        steps = [i for i, name in enumerate(names) if name == "FusedAdamW.step"]
        assert names[steps[0] : steps[1]].count("mark_step") == 8
        assert names[steps[0] : steps[1]].count("HPUGraph.replay") == (2 if strategy == "fast_ddp" else 0)
        # The host waits only at logging points (every step here) and the model's own mask checks.
        assert names[steps[0] : steps[1]].count("host_sync") <= 3
        assert names.count("FusedSDPA.apply") >= 3 * n_layer  # every training forward, every block
        assert ("memory_stats" in names) == (rank == 0)  # logged by the main process only
    assert "multi-node" not in res.stdout + res.stderr  # one host: no multi-node advice
