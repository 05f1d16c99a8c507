"""fast_ddp's gradient packing as HPU graphs, and PT_ENABLE_INT64_SUPPORT for --torch_compile (issue 23, item 8).

optimum-habana 1.21.2 captures fast_ddp's copies into and out of the fused buffer as two HPU graphs
(optimum/habana/distributed/fast_ddp.py, all_reduce_gradients(use_hpu_graphs=True), which its trainer
always passes) and adds no mark_step after the all-reduce: per optimizer step its host marks one step
per micro-batch and one after the optimizer. The stand-in's HPUGraph (tests/standin/.../hpu/hpugraph.py)
records captures and replays and re-runs the captured ops on replay, so the counts and the numbers
below are those of the bridge's rules.
"""

from __future__ import annotations

import textwrap

import pytest
import torch

from gaudi_launch.runtime.args import TrainingArguments
from gaudi_launch.runtime.device import select_device
from gaudi_launch.runtime.hpu_env import INT64_VAR, hpu_env_for_script, int64_support_setting, prepare_hpu_env
from tests.runtime.test_stand_in_hpu import ROOT, _run_ranks


def names(calls) -> list:
    return [name for name, _ in calls]


def test_stand_in_hpu_graph_replays_its_captured_ops_on_the_captured_tensors(hpu_stand_in, monkeypatch):
    monkeypatch.setenv("PT_HPU_LAZY_MODE", "1")
    import habana_frameworks.torch.hpu as hpu

    x, y = torch.ones(3).to("hpu"), torch.zeros(3).to("hpu")
    graph = hpu.HPUGraph()
    with hpu.stream(hpu.Stream()):
        graph.capture_begin()
        with pytest.raises(RuntimeError, match="already in progress"):
            hpu.HPUGraph().capture_begin()
        y.copy_(x * 2)
        graph.capture_end()
    assert y.cpu().tolist() == [2.0] * 3  # the capture ran the work
    x.fill_(5.0)
    graph.replay()
    assert y.cpu().tolist() == [10.0] * 3  # the replay read x's new values, through a fresh product
    x = torch.full((3,), 7.0).to("hpu")  # a new tensor named x: not the one the graph reads
    graph.replay()
    assert y.cpu().tolist() == [10.0] * 3
    calls = names(hpu_stand_in)
    assert calls.count("HPUGraph.capture_begin") == 1 and calls.count("HPUGraph.replay") == 2


def test_stand_in_hpu_graph_is_lazy_mode_only(hpu_stand_in, monkeypatch):
    monkeypatch.setenv("PT_HPU_LAZY_MODE", "0")
    import habana_frameworks.torch.hpu as hpu

    assert not hasattr(hpu, "HPUGraph") and hasattr(hpu, "Stream")


TRAIN = textwrap.dedent("""
    import json, sys
    import torch
    sys.path.insert(0, {root!r})
    import habana_frameworks
    from gaudi_launch.runtime.args import TrainingArguments
    from gaudi_launch.runtime.trainer import Trainer

    class Reg(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.lin1, self.lin2 = torch.nn.Linear(6, 8), torch.nn.Linear(8, 1)

        def forward(self, x, y):
            return {{"loss": torch.nn.functional.mse_loss(self.lin2(torch.tanh(self.lin1(x))).squeeze(-1), y)}}

    g = torch.Generator().manual_seed(1)
    xs, ys = torch.randn(64, 6, generator=g), torch.randn(64, generator=g)
    data = [{{"x": xs[i], "y": ys[i]}} for i in range(64)]
    out = {{}}
    for strategy in ("ddp", "fast_ddp"):
        args = TrainingArguments(device="hpu", use_lazy_mode=True, output_dir={out!r} + strategy, max_steps=4,
                                 logging_steps=100, per_device_train_batch_size=4, gradient_accumulation_steps=2,
                                 distribution_strategy=strategy, fast_ddp_buffer_dtype="fp32", save_steps=0,
                                 learning_rate=0.05, report_to="none")
        calls = habana_frameworks._calls
        ends = []
        trainer = Trainer(Reg(), args, train_dataset=data, log=lambda s: None, on_step_end=lambda s: ends.append(len(calls)))
        start = len(calls)
        res = trainer.train()
        steps, prev = [], start
        for end in ends:
            seq = [n for n, _ in calls[prev:end]]
            steps.append({{k: seq.count(k) for k in ("mark_step", "HPUGraph.capture_begin", "HPUGraph.replay")}})
            prev = end
        params = [p.detach().cpu().reshape(-1).tolist() for p in trainer.model.parameters()]
        out[strategy] = {{"loss": res.train_loss, "params": params, "steps": steps}}
        del trainer
    # Close the group once DDP's objects are gone: left to the interpreter's exit, gloo's threads were
    # destroyed still running ("terminate called without an active exception", SIGABRT) in one CI run.
    import gc
    import torch.distributed as dist
    gc.collect()
    dist.destroy_process_group()
    print(json.dumps(out))
""")


def test_stand_in_fast_ddp_packs_gradients_in_hpu_graphs_without_an_extra_mark_step(tmp_path):
    # Before: the packing ran op by op and the Trainer marked a step after the all-reduce: per step
    # 4 mark_steps (2 micro-batches + all-reduce + optimizer) and no graph.
    script = TRAIN.format(root=str(ROOT), out=str(tmp_path / "out-"))
    results = _run_ranks(tmp_path, script)
    for res in results:
        fast = res["fast_ddp"]
        assert [s["mark_step"] for s in fast["steps"]] == [3] * 4  # as optimum-habana: accumulation 2, + 1
        assert [s["HPUGraph.capture_begin"] for s in fast["steps"]] == [2, 0, 0, 0]  # pack and unpack, once
        assert [s["HPUGraph.replay"] for s in fast["steps"]] == [2] * 4
        assert [s["mark_step"] for s in res["ddp"]["steps"]] == [3] * 4
        # The replays reduce each step's own gradients: the same training as DDP's (fp32 buffer; the
        # sums differ in association only).
        assert fast["loss"] == pytest.approx(res["ddp"]["loss"], rel=1e-6)
        for a, b in zip(fast["params"], res["ddp"]["params"]):
            assert a == pytest.approx(b, abs=1e-6)
    assert results[0]["fast_ddp"]["params"] == results[1]["fast_ddp"]["params"]


# ---- PT_ENABLE_INT64_SUPPORT ----------------------------------------------------------------------


def test_int64_support_for_torch_compile_unless_the_user_set_it():
    assert int64_support_setting(True, {}) == "1"
    assert int64_support_setting(True, {INT64_VAR: "0"}) is None  # the user's own value stands
    assert int64_support_setting(False, {}) is None  # lazy mode: the bridge's default (int64 as int32)
    env: dict = {}
    assert prepare_hpu_env(TrainingArguments(torch_compile=True), None, environ=env) == {
        "PT_HPU_LAZY_MODE": "0",
        INT64_VAR: "1",
    }
    assert prepare_hpu_env(TrainingArguments(torch_compile=True), None, environ=env) == {}  # idempotent


def test_stand_in_int64_support_is_in_place_when_the_bridge_loads_for_torch_compile(hpu_stand_in):
    select_device(TrainingArguments(device="hpu", torch_compile=True))
    (seen,) = [d for n, d in hpu_stand_in if n == "core.import"]
    assert seen[INT64_VAR] == "1" and seen["PT_HPU_LAZY_MODE"] == "0"


def test_the_worker_sets_int64_support_for_a_torch_compile_script():
    env = hpu_env_for_script(["--torch_compile", "--output_dir", "x"], {}, None)
    assert env == {"PT_HPU_LAZY_MODE": "0", INT64_VAR: "1"}
    assert hpu_env_for_script(["--torch_compile"], {INT64_VAR: "false"}, None) == {"PT_HPU_LAZY_MODE": "0"}
