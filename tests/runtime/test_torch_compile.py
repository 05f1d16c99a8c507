"""--torch_compile on CPU for real: the Trainer steps through the compiled model, a short last batch
runs the graph compiled at the first step (no recompilation mid-run), and the loss falls."""

from __future__ import annotations

import json
import os

import pytest
import torch

from gaudi_launch.runtime.args import TrainingArguments
from gaudi_launch.runtime.device import DeviceInfo
from gaudi_launch.runtime.graphs import mark_batch_dynamic

transformers = pytest.importorskip("transformers")

CPU = DeviceInfo("cpu", torch.device("cpu"), "gloo", False, 0)
HPU = DeviceInfo("hpu", torch.device("cpu"), "hccl", False, 0)  # kind is all mark_batch_dynamic reads


def marked(batch) -> list:
    """The names of the tensors whose batch dimension torch.compile will treat as dynamic."""
    return sorted(k for k, v in batch.items() if 0 in getattr(v, "_dynamo_weak_dynamic_indices", set()))


def batch() -> dict:
    return {
        "input_ids": torch.zeros(4, 8, dtype=torch.long),
        "labels": torch.zeros(4, 8, dtype=torch.long),
        "scale": torch.tensor(1.0),
        "note": "not a tensor",
    }


def test_the_batch_dimension_is_dynamic_only_when_compiling_off_hpu():
    b = batch()
    mark_batch_dynamic(b, CPU, TrainingArguments(torch_compile=True))
    assert marked(b) == ["input_ids", "labels"]  # a 0-d tensor has no batch dimension
    for info, args in (
        (CPU, TrainingArguments()),  # eager: nothing to compile
        (HPU, TrainingArguments(torch_compile=True)),  # Gaudi keeps static shapes
        (CPU, TrainingArguments(torch_compile=True, compile_dynamic=False)),  # asked for static shapes
    ):
        b = batch()
        mark_batch_dynamic(b, info, args)
        assert marked(b) == [], (info.kind, args.torch_compile, args.compile_dynamic)


def test_torch_compile_trains_through_the_compiled_model_without_recompiling(tmp_path):
    from torch._dynamo.utils import counters

    from gaudi_launch.runtime import data
    from gaudi_launch.runtime.trainer import Trainer

    config = transformers.AutoConfig.from_pretrained(os.path.join(data.ASSETS, "tiny-gpt2"))
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    model.loss_type = "ForCausalLM"  # as run_clm.py: no warning (a graph break under compile) per forward
    ids = torch.randint(0, 64, (20, 32), generator=torch.Generator().manual_seed(0))
    dataset = data.BlockDataset([{"input_ids": row.tolist()} for row in ids])  # batches of 8, 8 and 4
    args = TrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=8,
        max_steps=9,
        learning_rate=3e-3,
        logging_steps=1,
        save_steps=0,
        device="cpu",
        torch_compile=True,
    )
    torch._dynamo.reset()
    counters.clear()
    graphs = {}

    def on_step(step):
        graphs[step] = (counters["stats"]["unique_graphs"], counters["aot_autograd"]["total"])

    trainer = Trainer(
        model,
        args,
        train_dataset=dataset,
        data_collator=data.causal_lm_collator,
        log=lambda s: None,
        on_step_end=on_step,
    )
    assert isinstance(trainer.train_model, torch._dynamo.eval_frame.OptimizedModule)
    assert trainer.train_model._orig_mod is trainer.model
    out = trainer.train()
    # The first step compiled forward and backward; batch 3's 4 samples (and steps 6 and 9's) ran the same graph.
    assert graphs[1][0] >= 1 and graphs[1][1] >= 1
    assert graphs[9] == graphs[1]
    rows = [r for r in map(json.loads, (tmp_path / "metrics.jsonl").read_text().splitlines()) if "loss" in r]
    assert len(rows) == 9 and rows[-1]["loss"] < rows[0]["loss"] - 0.5
    assert out.global_step == 9
