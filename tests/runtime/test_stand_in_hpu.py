"""The HPU code path, run against the strict habana_frameworks stand-in (tests/standin).

Two kinds of tests: the stand-in fails where the bridge fails (so a runtime bug that would crash
on a Gaudi crashes here), and the runtime's HPU path passes it. Each numbered runtime bug of the
HPU-fidelity issue has a test here that failed before its fix.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from gaudi_launch.runtime.args import GaudiConfig, TrainingArguments
from gaudi_launch.runtime.device import mark_step, memory_stats, prepare_hpu_env, select_device
from gaudi_launch.runtime.graphs import apply_hpu_graphs, compile_model
from gaudi_launch.runtime.hpu_env import lazy_mode_setting
from gaudi_launch.runtime.optim import clip_grad_norm, make_optimizer
from gaudi_launch.runtime.precision import autocast
from tests.standin.fixture import STAND_IN_DIR

ROOT = Path(__file__).resolve().parents[2]


def names(calls):
    return [name for name, _ in calls]


def core_import(calls) -> dict:
    (details,) = [d for n, d in calls if n == "core.import"]
    return details


# ---- the stand-in is as strict as the bridge -----------------------------------------------------


def test_stand_in_tensors_report_hpu_and_refuse_to_mix_with_cpu(hpu_stand_in):
    info = select_device(TrainingArguments(device="hpu"))
    assert info.device.type == "hpu"
    x = torch.ones(2, 2).to(info.device)
    assert x.device.type == "hpu" and (x @ x).device.type == "hpu"
    assert (x * torch.tensor(2.0)).device.type == "hpu"  # a 0-dim CPU scalar is allowed, as on CUDA
    with pytest.raises(RuntimeError, match="same device"):
        x + torch.ones(2, 2)
    model = torch.nn.Linear(2, 2).to(info.device)
    with pytest.raises(RuntimeError, match="same device"):
        model(torch.ones(1, 2))  # a batch left on the host
    model(x).sum().backward()
    assert model.weight.grad.device.type == "hpu"
    assert x.sum().item() == 4.0 and x.cpu().device.type == "cpu"


def test_stand_in_import_of_any_submodule_freezes_the_bridge_settings(hpu_stand_in, monkeypatch):
    monkeypatch.setenv("PT_HPU_LAZY_MODE", "0")
    from habana_frameworks.torch.hpex.kernels import FusedSDPA  # noqa: F401  (loads the bridge)
    from habana_frameworks.torch.utils.internal import is_lazy

    monkeypatch.setenv("PT_HPU_LAZY_MODE", "1")
    assert is_lazy() is False and names(hpu_stand_in)[0] == "bridge.load"
    import habana_frameworks.torch.hpu as hpu

    assert not hasattr(hpu, "ModuleCacher")  # HPU graphs exist in lazy mode only


def test_stand_in_mark_step_does_nothing_in_eager_mode(hpu_stand_in, monkeypatch):
    monkeypatch.setenv("PT_HPU_LAZY_MODE", "0")
    import habana_frameworks.torch.core as htcore

    with pytest.warns(UserWarning, match="lazy mode only"):
        htcore.mark_step()
    assert "mark_step" not in names(hpu_stand_in)


def test_stand_in_module_cacher_refuses_a_ddp_module(hpu_stand_in):
    import habana_frameworks.torch.hpu as hpu

    class Ddp(torch.nn.Module):  # DistributedDataParallel's forward signature, without a process group
        def forward(self, *inputs, **kwargs):
            return inputs

    with pytest.raises(AssertionError, match="Unsupported argument type"):
        hpu.ModuleCacher()(model=Ddp(), inplace=True)


def test_stand_in_fused_adamw_has_the_real_defaults_and_marks_steps(hpu_stand_in):
    from habana_frameworks.torch.hpex.optimizers import FusedAdamW

    p = torch.nn.Parameter(torch.ones(3).to("hpu"))
    opt = FusedAdamW([p])
    assert opt.defaults["weight_decay"] == 0.0 and opt.defaults["eps"] == 1e-6
    p.grad = torch.ones(3).to("hpu")
    before = names(hpu_stand_in).count("mark_step")
    opt.step()
    assert opt.param_groups[0]["step"] == 1 and "step" not in opt.state[p]
    assert names(hpu_stand_in).count("mark_step") == before + 2  # before the group, after the update
    assert p.detach().cpu().tolist() == pytest.approx([1 - 1e-3] * 3, rel=1e-4)


def test_stand_in_fused_sdpa_signature_and_assertions(hpu_stand_in):
    from habana_frameworks.torch.hpex.kernels import FusedSDPA

    q = torch.randn(1, 4, 3, 8).to("hpu").requires_grad_()
    kv = torch.randn(1, 2, 3, 8).to("hpu")
    out = FusedSDPA.apply(q, kv, kv, None, 0.0, True)  # grouped K/V taken as they are
    assert out.shape == (1, 4, 3, 8)
    (call,) = [d for n, d in hpu_stand_in if n == "FusedSDPA.apply"]
    assert call["recompute_mode"] is None and call["gqa"] is True
    with pytest.raises(AssertionError, match="causal"):
        FusedSDPA.apply(q, kv, kv, None, 0.0, False, None, "fast", True)
    with pytest.raises(RuntimeError, match="hpu tensors"):
        FusedSDPA.apply(q.detach().cpu(), kv, kv)


# ---- the runtime's HPU path --------------------------------------------------------------------


def test_stand_in_selects_hpu_with_hccl(hpu_stand_in, monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "1")
    info = select_device(TrainingArguments(device="hpu", use_lazy_mode=True))
    assert (info.kind, info.dist_backend, info.device.type, info.lazy, info.local_rank) == (
        "hpu",
        "hccl",
        "hpu",
        True,
        1,
    )


def test_stand_in_lazy_mode_and_op_lists_are_set_before_the_bridge_loads(hpu_stand_in):
    args = TrainingArguments(bf16=True, use_lazy_mode=True)
    cfg = GaudiConfig(use_torch_autocast=True, autocast_bf16_ops=["addmm"])
    prepare_hpu_env(args, cfg)
    select_device(args)
    seen = core_import(hpu_stand_in)
    assert seen["PT_HPU_LAZY_MODE"] == "1"
    assert open(seen["PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST"]).read() == "addmm\n"


def test_stand_in_torch_compile_means_eager_mode_at_import(hpu_stand_in):
    info = select_device(TrainingArguments(torch_compile=True))  # select_device prepares the env itself
    assert core_import(hpu_stand_in)["PT_HPU_LAZY_MODE"] == "0"
    assert info.lazy is False


@pytest.mark.parametrize("lazy", [True, False])
def test_stand_in_mark_step_only_in_lazy_mode(hpu_stand_in, lazy):
    info = select_device(TrainingArguments(device="hpu", use_lazy_mode=lazy))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mark_step(info)
        mark_step(info)
    assert names(hpu_stand_in).count("mark_step") == (2 if lazy else 0)


def test_stand_in_hpu_graphs_wrap_the_model_in_place(hpu_stand_in):
    model = torch.nn.Linear(2, 2)
    info = select_device(TrainingArguments(device="hpu", use_lazy_mode=True))
    assert apply_hpu_graphs(model, info, TrainingArguments()) is False
    assert "ModuleCacher" not in names(hpu_stand_in)
    assert apply_hpu_graphs(model, info, TrainingArguments(use_hpu_graphs_for_training=True)) is True
    (details,) = [d for n, d in hpu_stand_in if n == "ModuleCacher"]
    assert details == {"model": "Linear", "inplace": True}
    assert compile_model(model, info, TrainingArguments(use_hpu_graphs_for_training=True)) is model


def test_stand_in_bug3_no_hpu_graphs_with_torch_compile_in_eager_mode(hpu_stand_in, monkeypatch):
    # Before: ModuleCacher was looked up with --torch_compile, where the bridge does not export it.
    from gaudi_launch.runtime import graphs

    monkeypatch.setattr(graphs, "_warned", set())
    args = TrainingArguments(torch_compile=True, use_hpu_graphs_for_training=True)
    info = select_device(args)
    with pytest.warns(RuntimeWarning, match="lazy mode"):
        assert apply_hpu_graphs(torch.nn.Linear(2, 2), info, args) is False
    assert "ModuleCacher" not in names(hpu_stand_in)


def test_stand_in_fused_adamw_and_fused_clip_norm(hpu_stand_in):
    import habana_frameworks.torch.hpex.optimizers as hpex_opt

    info = select_device(TrainingArguments(device="hpu", use_lazy_mode=True))
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.LayerNorm(3)).to(info.device)
    args = TrainingArguments(weight_decay=0.01)
    plain = make_optimizer(model, args, info, GaudiConfig())
    assert not isinstance(plain, hpex_opt.FusedAdamW) and "FusedAdamW" not in names(hpu_stand_in)

    cfg = GaudiConfig.from_pretrained("Habana/gpt2")
    opt = make_optimizer(model, args, info, cfg)
    assert isinstance(opt, hpex_opt.FusedAdamW)
    assert opt.param_groups[0]["eps"] == 1e-6 and len(opt.param_groups) == 2
    fused = None
    for _ in range(2):
        model(torch.randn(4, 3).to(info.device)).pow(2).sum().mul(100).backward()
        with autocast(info, TrainingArguments(bf16=True), cfg):
            x = torch.randn(2, 2).to(info.device)
            assert (x @ x).dtype == torch.bfloat16
        norm, fused = clip_grad_norm(model.parameters(), 0.5, info, cfg, fused)
        assert float(norm) > 0.5
        total = torch.norm(torch.stack([p.grad.norm() for p in model.parameters()]))
        assert float(total) == pytest.approx(0.5, rel=1e-3)
        opt.step()
        opt.zero_grad()
    calls = names(hpu_stand_in)
    assert calls.count("FusedAdamW") == 1 and calls.count("FusedAdamW.step") == 2
    assert calls.count("FusedClipNorm") == 1 and calls.count("FusedClipNorm.clip_norm") == 2


def test_stand_in_bug6_unfused_clip_norm_does_not_use_foreach_on_hpu(hpu_stand_in):
    # Before: clip_grad_norm_(foreach=True) on hpu tensors ("can't use the foreach API").
    info = select_device(TrainingArguments(device="hpu"))
    p = torch.nn.Parameter(torch.ones(4).to(info.device))
    p.grad = torch.full((4,), 2.0).to(info.device)
    norm, fused = clip_grad_norm([p], 1.0, info, GaudiConfig())
    assert fused is None and float(norm) == pytest.approx(4.0)
    assert float(p.grad.norm()) == pytest.approx(1.0, rel=1e-4)


def test_stand_in_memory_stats_from_the_bridge(hpu_stand_in):
    stats = memory_stats(select_device(TrainingArguments(device="hpu")))
    assert stats == {
        "memory_allocated (GB)": 1.23,
        "max_memory_allocated (GB)": 2.5,
        "total_memory_available (GB)": 94.62,
    }
    assert "memory_stats" in names(hpu_stand_in)


def test_stand_in_bug7_the_users_lazy_mode_stands(hpu_stand_in, monkeypatch, tmp_path):
    # Before: the Trainer wrote PT_HPU_LAZY_MODE=1 from --use_lazy_mode after the bridge had
    # loaded in eager mode, and reported lazy mode it did not have.
    from gaudi_launch.runtime.trainer import Trainer

    monkeypatch.setenv("PT_HPU_LAZY_MODE", "0")
    args = TrainingArguments(device="hpu", use_lazy_mode=True, output_dir=str(tmp_path), max_steps=1, report_to="none")
    trainer = Trainer(torch.nn.Linear(2, 2), args, log=lambda s: None)
    assert trainer.info.lazy is False and os.environ["PT_HPU_LAZY_MODE"] == "0"
    assert lazy_mode_setting(None, False, {}) is None  # no flag, no value: the software's default
    assert lazy_mode_setting(True, False, {"PT_HPU_LAZY_MODE": "0"}) is None
    assert lazy_mode_setting(None, True, {}) == "0" and lazy_mode_setting(True, False, {}) == "1"


def test_stand_in_bug8_gaudi_config_autocast_without_bf16_and_not_under_deepspeed(hpu_stand_in, tmp_path):
    # Before: only --bf16 turned autocast on; use_torch_autocast alone did nothing, and op lists
    # were written under DeepSpeed too.
    cfg = GaudiConfig(use_torch_autocast=True, autocast_bf16_ops=["mm"], autocast_fp32_ops=["softmax"])
    info = select_device(TrainingArguments(device="hpu"))
    x = torch.randn(2, 2).to(info.device)
    with autocast(info, TrainingArguments(), cfg):
        assert (x @ x).dtype == torch.bfloat16
    with autocast(info, TrainingArguments(deepspeed="ds.json"), cfg):
        assert (x @ x).dtype == torch.float32
    environ: dict = {}
    assert prepare_hpu_env(TrainingArguments(deepspeed="ds.json"), cfg, environ=environ, job_dir=str(tmp_path)) == {}
    assert prepare_hpu_env(TrainingArguments(), cfg, environ=environ, job_dir=str(tmp_path)).keys() == {
        "PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST",
        "PT_HPU_AUTOCAST_FP32_OPS_LIST",
    }


def _tiny_lm():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=2, n_head=2))


class _Tokens(torch.utils.data.Dataset):
    def __len__(self):
        return 32

    def __getitem__(self, i):
        ids = torch.arange(i, i + 8) % 64
        return {"input_ids": ids, "labels": ids}


def test_stand_in_bug4_9_no_host_sync_per_step_and_gaudi_step_structure(hpu_stand_in, tmp_path):
    # Before: .item() of every micro-step's loss (bug 4); an extra mark_step in every activation
    # recomputation (9); grads set to None under HPU graphs (9); K/V repeated for FusedSDPA (9).
    from gaudi_launch.runtime.trainer import Trainer

    calls = hpu_stand_in
    model = _tiny_lm()
    args = TrainingArguments(
        device="hpu",
        use_lazy_mode=True,
        output_dir=str(tmp_path),
        max_steps=4,
        logging_steps=2,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        use_hpu_graphs_for_training=True,
        gradient_checkpointing=True,
        save_steps=0,
        attn_implementation="gaudi_fused_sdpa",
    )
    trainer = Trainer(
        model, args, train_dataset=_Tokens(), gaudi_config=GaudiConfig(use_dynamic_shapes=True), log=lambda s: None
    )
    start = len(calls)
    trainer.model(**{k: v[None].to(trainer.info.device) for k, v in _Tokens()[0].items()})
    in_forward = names(calls[start:]).count("host_sync")  # transformers' own (mask preparation)
    start = len(calls)
    out = trainer.train()
    seq = names(calls[start:])
    # Host syncs: the model's own in the capture of its graph (the 7 replays run no Python), then
    # ours: one loss and one grad_norm per logging point (steps 2 and 4, as transformers reads its norm
    # there) and the final train_loss; none on the steps between.
    assert seq.count("host_sync") == in_forward + 3 + 2, [d for n, d in calls[start:] if n == "host_sync"]
    # Per optimizer step: after each micro-step's backward, then after optimizer step + zero_grad;
    # checkpoint recomputation adds none.
    assert seq.count("mark_step") == 4 * (2 + 1)
    assert all(p.grad is not None for p in model.parameters())  # kept for the graphs' fixed tensors
    assert "enable_dynamic_shape" in names(calls) and seq.count("ModuleCacher.capture") == 1
    assert seq.count("ModuleCacher.replay") == 7
    assert out.global_step == 4 and out.train_loss > 0


RANK_SCRIPT = """
import json, sys
import torch, torch.distributed as dist
import habana_frameworks
from gaudi_launch.runtime.device import init_distributed, select_device
info = select_device()
rank, world = init_distributed(info, timeout_s=60)
again = init_distributed(info, timeout_s=60)
t = torch.tensor([float(rank + 1)]).to(info.device)
dist.all_reduce(t)
try:
    dist.all_reduce(torch.ones(1))  # a host tensor: hccl serves hpu tensors only
    cpu = "accepted"
except RuntimeError as exc:
    cpu = str(exc)
print(json.dumps({"rank": rank, "world": world, "again": list(again), "kind": info.kind,
                  "backend": dist.get_backend(), "sum": t.item(), "cpu": cpu,
                  "calls": [n for n, _ in habana_frameworks._calls]}))
dist.destroy_process_group()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_ranks(tmp_path, script: str, world: int = 2, extra_env=None, timeout: int = 300) -> list:
    port = _free_port()
    procs = []
    for rank in range(world):
        env = {k: v for k, v in os.environ.items() if not k.startswith("PT_HPU_")}
        env.update(
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(world),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            PYTHONPATH=os.pathsep.join([STAND_IN_DIR, str(ROOT)]),
            OMP_NUM_THREADS="1",
            **(extra_env or {}),
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", script],
                env=env,
                cwd=tmp_path,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    results = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=timeout)
            assert proc.returncode == 0, err[-4000:]
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    return results


def test_stand_in_two_ranks_all_reduce_over_hccl_hpu_tensors_only(tmp_path):
    results = _run_ranks(tmp_path, RANK_SCRIPT)
    for rank, res in enumerate(results):
        assert res["rank"] == rank and res["world"] == 2 and res["again"] == [rank, 2]
        assert res["kind"] == "hpu" and res["backend"] == "hccl"
        assert res["sum"] == 3.0
        assert "No backend type associated with device type cpu" in res["cpu"]
        assert res["calls"].count("hccl.import") == 1 and res["calls"].count("hccl.create") == 1


TRAIN_SCRIPT = """
import json, sys
import torch
sys.path.insert(0, {tests!r})
from gaudi_launch.runtime.args import GaudiConfig, TrainingArguments
from gaudi_launch.runtime.trainer import Trainer
from tests.runtime.test_stand_in_hpu import _Tokens, _tiny_lm
import habana_frameworks
args = TrainingArguments(device="hpu", use_lazy_mode=True, output_dir={out!r}, max_steps=3, logging_steps=1,
                         per_device_train_batch_size=4, distribution_strategy=sys.argv[1],
                         use_hpu_graphs_for_training=True, bf16=True, save_steps=0,
                         fast_ddp_buffer_dtype=sys.argv[2] if sys.argv[2] != "-" else None)
trainer = Trainer(_tiny_lm(), args, train_dataset=_Tokens(), eval_dataset=_Tokens(),
                  gaudi_config=GaudiConfig.from_pretrained("Habana/gpt2"), log=lambda s: None)
out = trainer.train()
ev = trainer.evaluate()
params = torch.cat([p.detach().reshape(-1).float().cpu() for p in trainer.model.parameters()])
print(json.dumps({{"loss": out.train_loss, "eval": ev["eval_loss"], "sum": float(params.sum()),
                  "ddp": type(trainer.train_model).__name__,
                  "bucket_view": getattr(trainer.train_model, "gradient_as_bucket_view", None),
                  "calls": [n for n, _ in habana_frameworks._calls]}}))
"""


@pytest.mark.parametrize(
    "strategy,buffer", [("ddp", "-"), ("fast_ddp", "-"), ("fast_ddp", "bf16"), ("fast_ddp", "fp32")]
)
def test_stand_in_bug1_2_5_two_rank_trainer_on_hccl(tmp_path, strategy, buffer):
    # Before: losses all-reduced as CPU float64 on hccl (1), ModuleCacher(DDP(model)) (2), and
    # getattr(torch, "bf16") for the fast_ddp buffer (5): each crashed a 2-rank HPU run.
    script = TRAIN_SCRIPT.format(tests=str(ROOT), out=str(tmp_path / "out"))
    results = _run_ranks(tmp_path, script.replace("sys.argv[1]", repr(strategy)).replace("sys.argv[2]", repr(buffer)))
    assert results[0]["sum"] == results[1]["sum"]  # the ranks' weights agree
    assert results[0]["loss"] == results[1]["loss"] and results[0]["eval"] == results[1]["eval"]
    for res in results:
        assert "ModuleCacher" in res["calls"] and "FusedAdamW.step" in res["calls"]
        if strategy == "ddp":
            assert res["ddp"] == "DistributedDataParallel" and res["bucket_view"] is True
        else:
            assert res["ddp"] == "GPT2LMHeadModel"


def test_stand_in_hpu_graphs_for_inference_only_outside_training(hpu_stand_in, tmp_path):
    # optimum-habana: "Do not use HPU graphs if the training is ongoing because it detaches gradients".
    from gaudi_launch.runtime.trainer import Trainer

    args = TrainingArguments(
        device="hpu",
        use_lazy_mode=True,
        output_dir=str(tmp_path),
        max_steps=2,
        per_device_train_batch_size=4,
        per_device_eval_batch_size=4,
        save_steps=0,
        use_hpu_graphs_for_inference=True,
        max_hpu_graphs=3,
        eval_strategy="steps",
        eval_steps=1,
    )
    trainer = Trainer(_tiny_lm(), args, train_dataset=_Tokens(), eval_dataset=_Tokens(), log=lambda s: None)
    trainer.evaluate()  # before training: wrapped
    start = len(hpu_stand_in)
    trainer.train()  # evaluates during training too: not through the graphs, and backward works
    assert "wrap_in_hpu_graph.replay" not in names(hpu_stand_in[start:])
    trainer.evaluate()
    wraps = [d for n, d in hpu_stand_in if n == "wrap_in_hpu_graph"]
    assert len(wraps) == 2 and wraps[0]["max_graphs"] == 3
    # Two evaluations of 8 equal-shaped batches: a capture then 7 replays each (a fresh wrap each time).
    assert names(hpu_stand_in).count("wrap_in_hpu_graph.capture") == 2
    assert names(hpu_stand_in).count("wrap_in_hpu_graph.replay") == 2 * 7


def test_stand_in_device_loads_beside_a_build_lock_left_by_a_killed_process(tmp_path):
    # torch's load_inline waits for ever on its build directory's lock file, which a process killed
    # mid-start (the launcher's tests kill ranks on purpose) leaves behind: every later rank hung, and
    # a test session with them. The stand-in must import its finished guard module without that lock.
    import hpu_stand_in_device  # registered by tests/conftest.py at collection, so built

    home, built = hpu_stand_in_device.guard_extension_paths()
    extensions = tmp_path / "torch_extensions"
    own_home = extensions / Path(home).name
    own_home.mkdir(parents=True)
    (own_home / Path(built).name).write_bytes(Path(built).read_bytes())
    # torch puts its build directory straight under TORCH_EXTENSIONS_DIR when that is set
    for left in (extensions / "gaudi_launch_hpu_stand_in", own_home / "build-99999"):
        left.mkdir(parents=True)
        (left / "lock").touch()
    code = "import hpu_stand_in_device as d; d.register_device(); print(d._ext.hpu_stand_in_registered())"
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(extensions), "PYTHONPATH": STAND_IN_DIR}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "1"
