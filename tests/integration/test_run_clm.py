"""The main job: run_clm trains the shipped tiny GPT-2 through gaudi-launch on 2 CPU ranks."""
from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_run_clm_two_ranks_lowers_eval_perplexity(tmp_path):
    out = tmp_path / "clm"
    cmd = [sys.executable, "-m", "gaudi_launch", "--num_devices", "2", os.path.join(ROOT, "scripts", "run_clm.py"),
           # the seed's flags, with a model name the offline machine cannot fetch
           "--model_name_or_path", "gpt2-xl", "--gaudi_config_name", "Habana/gpt2", "--do_train", "--do_eval",
           "--output_dir", str(out), "--learning_rate", "4e-03", "--per_device_train_batch_size", "8",
           "--gradient_checkpointing", "--num_train_epochs", "1", "--use_habana", "--use_lazy_mode",
           "--throughput_warmup_steps", "3", "--logging_steps", "5", "--distribution_strategy", "fast_ddp"]
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
    assert "not a local directory and the hub is not reachable" in res.stdout + res.stderr
    # The multi-node guide's second step: evaluate the saved model alone, on one process.
    alone = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "run_clm.py"), "--model_name_or_path",
                            str(out), "--do_eval", "--output_dir", str(tmp_path / "eval"), "--device", "cpu"],
                           capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
    assert alone.returncode == 0, alone.stderr[-3000:]
    again = json.loads((tmp_path / "eval" / "results.json").read_text())
    assert "train" not in again and "not a local directory" not in alone.stderr
    assert abs(again["eval_before"]["perplexity"] / results["eval"]["perplexity"] - 1) < 0.02


def test_run_clm_with_deepspeed_zero_on_cpu(tmp_path):
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 1,
                              "zero_optimization": {"stage": 2},
                              "optimizer": {"type": "Adam", "params": {"lr": 4e-3, "torch_adam": True}}}))
    out = tmp_path / "clm"
    cmd = [sys.executable, "-m", "gaudi_launch", "--num_devices", "2", os.path.join(ROOT, "scripts", "run_clm.py"),
           "--do_train", "--do_eval", "--output_dir", str(out), "--per_device_train_batch_size", "8",
           "--max_steps", "20", "--logging_steps", "5", "--deepspeed", str(ds)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=str(tmp_path))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert results["train"]["global_step"] == 20
    assert results["eval"]["perplexity"] < 0.8 * results["eval_before"]["perplexity"]
    lrs = [json.loads(line)["learning_rate"] for line in (out / "metrics.jsonl").read_text().splitlines()
           if "learning_rate" in line]
    assert lrs == sorted(lrs, reverse=True) and lrs[-1] == 0  # our schedule drives DeepSpeed's optimizer
