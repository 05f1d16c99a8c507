"""The HPU code path, run against the recording habana_frameworks stand-in (tests/standin)."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gaudi_launch.runtime.args import GaudiConfig, TrainingArguments
from gaudi_launch.runtime.device import mark_step, memory_stats, prepare_hpu_env, select_device
from gaudi_launch.runtime.graphs import wrap_for_graphs
from gaudi_launch.runtime.optim import clip_grad_norm, make_optimizer
from gaudi_launch.runtime.precision import autocast
from tests.standin.fixture import STAND_IN_DIR

ROOT = Path(__file__).resolve().parents[2]


def names(calls):
    return [name for name, _ in calls]


def core_import(calls) -> dict:
    (details,) = [d for n, d in calls if n == "core.import"]
    return details


def test_stand_in_selects_hpu_with_hccl_on_cpu_tensors(hpu_stand_in, monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "1")
    info = select_device(TrainingArguments())
    assert (info.kind, info.dist_backend, info.device, info.lazy, info.local_rank) == \
        ("hpu", "hccl", torch.device("cpu"), True, 1)


def test_lazy_mode_is_set_before_the_bridge_is_imported(hpu_stand_in):
    args = TrainingArguments(bf16=True)
    cfg = GaudiConfig(use_torch_autocast=True, autocast_bf16_ops=["addmm"])
    prepare_hpu_env(args, cfg)
    select_device(args)
    seen = core_import(hpu_stand_in)
    assert seen["PT_HPU_LAZY_MODE"] == "1"
    assert open(seen["PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST"]).read() == "addmm\n"


def test_torch_compile_means_eager_mode_at_import(hpu_stand_in):
    info = select_device(TrainingArguments(torch_compile=True))  # select_device prepares the env itself
    assert core_import(hpu_stand_in)["PT_HPU_LAZY_MODE"] == "0"
    assert info.lazy is False


@pytest.mark.parametrize("lazy", [True, False])
def test_mark_step_only_in_lazy_mode(hpu_stand_in, lazy):
    info = select_device(TrainingArguments(use_lazy_mode=lazy))
    mark_step(info)
    mark_step(info)
    assert names(hpu_stand_in).count("mark_step") == (2 if lazy else 0)


def test_hpu_graphs_wrap_with_module_cacher(hpu_stand_in):
    model = torch.nn.Linear(2, 2)
    info = select_device(TrainingArguments())
    assert wrap_for_graphs(model, info, TrainingArguments()) is model
    assert "ModuleCacher" not in names(hpu_stand_in)
    assert wrap_for_graphs(model, info, TrainingArguments(use_hpu_graphs_for_training=True)) is model
    (details,) = [d for n, d in hpu_stand_in if n == "ModuleCacher"]
    assert details == {"model": "Linear", "inplace": True}


def test_hpu_graphs_skipped_in_eager_mode_without_compile(hpu_stand_in, monkeypatch):
    from gaudi_launch.runtime import graphs

    monkeypatch.setattr(graphs, "_warned", set())
    args = TrainingArguments(use_lazy_mode=False, use_hpu_graphs_for_training=True)
    info = select_device(args)
    with pytest.warns(RuntimeWarning, match="lazy mode or torch_compile"):
        wrap_for_graphs(torch.nn.Linear(2, 2), info, args)
    assert "ModuleCacher" not in names(hpu_stand_in)


def test_fused_adamw_and_fused_clip_norm(hpu_stand_in):
    import habana_frameworks.torch.hpex.optimizers as hpex_opt

    info = select_device(TrainingArguments())
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.LayerNorm(3))
    args = TrainingArguments(weight_decay=0.01)
    plain = make_optimizer(model, args, info, GaudiConfig())
    assert not isinstance(plain, hpex_opt.FusedAdamW) and "FusedAdamW" not in names(hpu_stand_in)

    cfg = GaudiConfig.from_pretrained("Habana/gpt2")
    opt = make_optimizer(model, args, info, cfg)
    assert isinstance(opt, hpex_opt.FusedAdamW)
    assert opt.param_groups[0]["eps"] == 1e-6 and len(opt.param_groups) == 2
    fused = None
    for _ in range(2):
        model(torch.randn(4, 3)).pow(2).sum().mul(100).backward()
        with autocast(info, TrainingArguments(bf16=True), cfg):
            assert (torch.randn(2, 2) @ torch.randn(2, 2)).dtype == torch.bfloat16
        norm, fused = clip_grad_norm(model.parameters(), 0.5, info, cfg, fused)
        assert float(norm) > 0.5
        total = torch.norm(torch.stack([p.grad.norm() for p in model.parameters()]))
        assert float(total) == pytest.approx(0.5, rel=1e-3)
        opt.step()
        opt.zero_grad()
    calls = names(hpu_stand_in)
    assert calls.count("FusedAdamW") == 1 and calls.count("FusedAdamW.step") == 2
    assert calls.count("FusedClipNorm") == 1 and calls.count("FusedClipNorm.clip_norm") == 2

    _, none = clip_grad_norm(model.parameters(), 0.5, info, GaudiConfig(), None)
    assert none is None and calls.count("FusedClipNorm") == 1


def test_memory_stats_from_the_bridge(hpu_stand_in):
    stats = memory_stats(select_device(TrainingArguments()))
    assert stats == {"memory_allocated (GB)": 1.23, "max_memory_allocated (GB)": 2.5,
                     "total_memory_available (GB)": 94.62}
    assert "memory_stats" in names(hpu_stand_in)


RANK_SCRIPT = """
import json, sys
import torch, torch.distributed as dist
import habana_frameworks
from gaudi_launch.runtime.device import init_distributed, select_device
info = select_device()
rank, world = init_distributed(info, timeout_s=60)
again = init_distributed(info, timeout_s=60)
t = torch.tensor([float(rank + 1)], device=info.device)
dist.all_reduce(t)
print(json.dumps({"rank": rank, "world": world, "again": list(again), "kind": info.kind,
                  "backend": dist.get_backend(), "sum": t.item(),
                  "calls": [n for n, _ in habana_frameworks._calls]}))
dist.destroy_process_group()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_ranks_all_reduce_over_the_hccl_stand_in(tmp_path):
    port = _free_port()
    procs = []
    for rank in range(2):
        env = {k: v for k, v in os.environ.items() if not k.startswith("PT_HPU_")}
        env.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), PYTHONPATH=os.pathsep.join([STAND_IN_DIR, str(ROOT)]))
        procs.append(subprocess.Popen([sys.executable, "-c", RANK_SCRIPT], env=env, cwd=tmp_path,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=90)
            assert proc.returncode == 0, err
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    for rank, res in enumerate(results):
        assert res["rank"] == rank and res["world"] == 2 and res["again"] == [rank, 2]
        assert res["kind"] == "hpu" and res["backend"] == "hccl"
        assert res["sum"] == 3.0
        assert res["calls"].count("hccl.import") == 1 and res["calls"].count("hccl.create") == 1
