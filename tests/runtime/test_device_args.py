"""Training arguments, Gaudi config, device set-up and the accelerations' CPU paths."""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import dataclass, field
from typing import Optional

import pytest
import torch

from gaudi_launch.runtime import args as rargs
from gaudi_launch.runtime import graphs
from gaudi_launch.runtime.args import GaudiConfig, TrainingArguments, parse_args
from gaudi_launch.runtime.device import (
    DeviceInfo,
    init_distributed,
    mark_step,
    memory_stats,
    prepare_hpu_env,
    select_device,
)
from gaudi_launch.runtime.optim import clip_grad_norm, make_optimizer, make_scheduler
from gaudi_launch.runtime.precision import autocast


@dataclass
class ModelArguments:
    model_name_or_path: Optional[str] = field(default=None, metadata={"help": "model"})
    block_size: Optional[int] = None


RUN_CLM = (
    "--model_name_or_path gpt2-xl --gaudi_config_name Habana/gpt2 --do_train --output_dir o "
    "--learning_rate 4e-04 --per_device_train_batch_size 16 --gradient_checkpointing "
    "--num_train_epochs 1 --use_habana --use_lazy_mode --throughput_warmup_steps 3 "
    "--deepspeed cfg.json"
).split()


def cpu_info() -> DeviceInfo:
    return DeviceInfo("cpu", torch.device("cpu"), "gloo", False, 0)


# ---------------------------------------------------------------------------------------- parse


def test_run_clm_command_line_fills_both_dataclasses():
    model_args, args = parse_args((ModelArguments, TrainingArguments), RUN_CLM)
    assert model_args.model_name_or_path == "gpt2-xl" and model_args.block_size is None
    assert args.gaudi_config_name == "Habana/gpt2"
    assert args.do_train is True and args.do_eval is False
    assert args.output_dir == "o"
    assert args.learning_rate == pytest.approx(4e-4)
    assert args.per_device_train_batch_size == 16
    assert args.gradient_checkpointing is True
    assert args.num_train_epochs == 1.0
    assert args.use_habana is True and args.use_lazy_mode is True
    assert args.throughput_warmup_steps == 3
    assert args.deepspeed == "cfg.json"
    # untouched defaults are GaudiTrainingArguments'
    assert args.adam_epsilon == 1e-6 and args.distribution_strategy == "ddp"
    assert args.half_precision_backend == "hpu_amp" and args.local_rank == -1 and args.device is None


@pytest.mark.parametrize(
    "argv, expected",
    [
        ([], False),
        (["--bf16"], True),
        (["--bf16", "true"], True),
        (["--bf16", "False"], False),
        (["--bf16=yes"], True),
        (["--bf16", "0"], False),
        (["--no_bf16"], False),
        (["--no-bf16"], False),
    ],
)
def test_bool_spellings(argv, expected):
    (args,) = parse_args((TrainingArguments,), argv)
    assert args.bf16 is expected


def test_default_true_bool_can_be_turned_off_and_dash_spellings_work():
    (args,) = parse_args(
        (TrainingArguments,),
        ["--no_use_lazy_mode", "--use-hpu-graphs-for-training", "--per-device-train-batch-size", "4", "--local-rank=3"],
    )
    assert args.use_lazy_mode is False and args.use_hpu_graphs_for_training is True
    assert args.per_device_train_batch_size == 4 and args.local_rank == 3
    (args,) = parse_args((TrainingArguments,), ["--use_lazy_mode", "false", "--save_total_limit", "2"])
    assert args.use_lazy_mode is False and args.save_total_limit == 2


def test_unknown_argument_exits_2_naming_it(capsys):
    with pytest.raises(SystemExit) as exc:
        parse_args((ModelArguments, TrainingArguments), ["--do_train", "--learnin_rate", "1"])
    assert exc.value.code == 2
    assert "--learnin_rate" in capsys.readouterr().err


def test_no_abbreviations_and_choices_enforced(capsys):
    with pytest.raises(SystemExit):
        parse_args((TrainingArguments,), ["--learning", "1e-3"])  # not a prefix of --learning_rate
    with pytest.raises(SystemExit) as exc:
        parse_args((TrainingArguments,), ["--distribution_strategy", "zero"])
    assert exc.value.code == 2 and "fast_ddp" in capsys.readouterr().err
    with pytest.raises(ValueError, match="half_precision_backend"):
        TrainingArguments(half_precision_backend="fp16")


def test_duplicate_field_across_dataclasses_is_a_clear_error():
    @dataclass
    class Other:
        output_dir: str = "x"

    with pytest.raises(ValueError, match="output_dir.*TrainingArguments.*Other"):
        parse_args((TrainingArguments, Other), [])


# -------------------------------------------------------------------------------- gaudi config


def test_gaudi_config_shipped_name_file_and_dir(tmp_path):
    cfg = GaudiConfig.from_pretrained("Habana/gpt2")
    assert (cfg.use_fused_adam, cfg.use_fused_clip_norm, cfg.use_torch_autocast) == (True, True, True)
    assert cfg.use_dynamic_shapes is False and cfg.autocast_bf16_ops is None
    assert {"Habana/gpt2", "Habana/bert-base-uncased"} <= set(rargs.shipped_gaudi_configs())
    assert GaudiConfig.from_pretrained("Habana/bert-base-uncased").use_fused_adam is True

    path = tmp_path / "gaudi_config.json"
    path.write_text(json.dumps({"use_torch_autocast": True, "autocast_bf16_ops": ["matmul", "linear"]}))
    assert GaudiConfig.from_pretrained(str(path)).autocast_bf16_ops == ["matmul", "linear"]
    assert GaudiConfig.from_pretrained(tmp_path).use_torch_autocast is True


def test_gaudi_config_errors_and_unknown_keys(tmp_path):
    with pytest.raises(FileNotFoundError) as exc:
        GaudiConfig.from_pretrained("Habana/llama-nope")
    assert "Habana/gpt2" in str(exc.value) and "Hub is not consulted" in str(exc.value)
    with pytest.raises(FileNotFoundError, match="no gaudi_config.json"):
        GaudiConfig.from_pretrained(tmp_path)
    path = tmp_path / "g.json"
    path.write_text('{"use_fused_adam": true, "use_habana_mixed_precision": false}')
    with pytest.warns(UserWarning, match="use_habana_mixed_precision"):
        cfg = GaudiConfig.from_pretrained(path)
    assert cfg.use_fused_adam is True
    path.write_text("{nope")
    with pytest.raises(ValueError, match="not valid JSON"):
        GaudiConfig.from_pretrained(path)


# ----------------------------------------------------------------------------------- hpu env


def test_prepare_hpu_env_writes_per_job_op_lists(tmp_path):
    args = TrainingArguments(bf16=True, use_lazy_mode=True)
    cfg = GaudiConfig(use_torch_autocast=True, autocast_bf16_ops=["addmm", "bmm"], autocast_fp32_ops=["softmax"])
    env1, env2 = {}, {}
    out1 = prepare_hpu_env(args, cfg, environ=env1, job_dir=str(tmp_path))
    out2 = prepare_hpu_env(args, cfg, environ=env2)
    assert out1 == env1 and out2 == env2
    assert env1["PT_HPU_LAZY_MODE"] == "1"
    low1, low2 = env1["PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST"], env2["PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST"]
    assert low1 != low2 and os.path.dirname(low1) == str(tmp_path)
    assert not low2.startswith("/tmp/lower_list")
    assert open(low1).read() == open(low2).read() == "addmm\nbmm\n"
    assert open(env1["PT_HPU_AUTOCAST_FP32_OPS_LIST"]).read() == "softmax\n"
    # a second call in the same job dir never overwrites the first one's files
    again = prepare_hpu_env(args, cfg, environ={}, job_dir=str(tmp_path))
    assert again["PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST"] != low1


def test_prepare_hpu_env_lazy_mode_follows_the_flags_and_lists_need_autocast():
    cfg = GaudiConfig(autocast_bf16_ops=["addmm"])  # lists, but use_torch_autocast off and no --bf16
    assert prepare_hpu_env(TrainingArguments(), cfg, environ={}) == {}  # the software's own default mode
    assert prepare_hpu_env(TrainingArguments(use_lazy_mode=True), cfg, environ={}) == {"PT_HPU_LAZY_MODE": "1"}
    assert prepare_hpu_env(TrainingArguments(torch_compile=True), cfg, environ={}) == {
        "PT_HPU_LAZY_MODE": "0",
        "PT_ENABLE_INT64_SUPPORT": "1",
    }
    assert prepare_hpu_env(TrainingArguments(use_lazy_mode=False), None, environ={}) == {"PT_HPU_LAZY_MODE": "0"}
    assert prepare_hpu_env(TrainingArguments(use_lazy_mode=True), None, environ={"PT_HPU_LAZY_MODE": "0"}) == {}


# ------------------------------------------------------------------------------------ device


def test_select_device_on_this_machine_is_cpu_gloo(monkeypatch):
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    info = select_device(TrainingArguments())
    assert (info.kind, info.device, info.dist_backend, info.lazy, info.local_rank) == (
        "cpu",
        torch.device("cpu"),
        "gloo",
        False,
        0,
    )
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert select_device(force="cpu").local_rank == 3
    with pytest.raises(RuntimeError, match="habana_frameworks"):
        select_device(force="hpu")
    with pytest.raises(RuntimeError, match="cuda"):
        select_device(TrainingArguments(device="cuda"))


def test_single_process_needs_no_process_group(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert init_distributed(cpu_info()) == (0, 1)
    assert not torch.distributed.is_initialized()


def test_mark_step_is_a_no_op_off_hpu():
    mark_step(cpu_info())  # must not import anything HPU


def test_memory_stats_on_cpu():
    stats = memory_stats(cpu_info())
    assert set(stats) == {"memory_allocated (GB)", "max_memory_allocated (GB)", "total_memory_available (GB)"}
    assert stats["memory_allocated (GB)"] > 0
    assert stats["max_memory_allocated (GB)"] >= stats["memory_allocated (GB)"]
    assert stats["total_memory_available (GB)"] >= stats["max_memory_allocated (GB)"]
    assert all(v == round(v, 2) for v in stats.values())


# ---------------------------------------------------------------------------- accelerations


def test_autocast_on_cpu():
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    with autocast(cpu_info(), TrainingArguments(bf16=True), None):
        assert (a @ b).dtype == torch.bfloat16
    with autocast(cpu_info(), TrainingArguments(bf16=False), None):
        assert (a @ b).dtype == torch.float32


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(10, 4)
        self.proj = torch.nn.Linear(4, 4)
        self.LayerNorm = torch.nn.LayerNorm(4)
        self.head = torch.nn.Linear(4, 10, bias=False)
        self.head.weight = self.emb.weight  # tied

    def forward(self, x):
        return self.head(self.LayerNorm(self.proj(self.emb(x))))


def test_make_optimizer_groups_and_eps():
    model = Tiny()
    opt = make_optimizer(model, TrainingArguments(weight_decay=0.1, learning_rate=1e-3), cpu_info(), None)
    assert isinstance(opt, torch.optim.AdamW)
    decay, no_decay = opt.param_groups
    ids = lambda ps: {id(p) for p in ps}  # noqa: E731
    assert ids(decay["params"]) == {id(model.emb.weight), id(model.proj.weight)}
    assert ids(no_decay["params"]) == {id(model.proj.bias), id(model.LayerNorm.weight), id(model.LayerNorm.bias)}
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert decay["eps"] == 1e-6 and decay["lr"] == 1e-3 and decay["fused"] is True
    # it trains
    loss = model(torch.tensor([1, 2])).sum()
    loss.backward()
    before = model.proj.weight.detach().clone()
    opt.step()
    assert not torch.equal(before, model.proj.weight)


def test_clip_grad_norm_clips():
    p = torch.nn.Parameter(torch.zeros(4))
    p.grad = torch.full((4,), 3.0)  # norm 6
    norm, fused = clip_grad_norm([p], 1.0, cpu_info(), GaudiConfig(use_fused_clip_norm=True))
    assert float(norm) == pytest.approx(6.0) and fused is None
    assert float(p.grad.norm()) == pytest.approx(1.0, rel=1e-4)


def test_scheduler_values():
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=1.0)
    sched = make_scheduler(opt, TrainingArguments(warmup_steps=2), num_training_steps=10)
    lrs = []
    for _ in range(11):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs[:4] == pytest.approx([0.0, 0.5, 1.0, 0.875])
    assert lrs[6] == pytest.approx(0.5) and lrs[10] == pytest.approx(0.0)
    opt2 = torch.optim.SGD([p], lr=2.0)
    const = make_scheduler(opt2, TrainingArguments(lr_scheduler_type="constant", warmup_steps=5), 10)
    opt2.step()
    const.step()
    assert opt2.param_groups[0]["lr"] == 2.0


def test_graphs_on_cpu_warn_once_and_keep_the_model(monkeypatch):
    monkeypatch.setattr(graphs, "_warned", set())
    model = Tiny()
    graphs_on = TrainingArguments(use_hpu_graphs_for_training=True)
    with pytest.warns(RuntimeWarning, match="do not apply on CPU"):
        assert graphs.compile_model(model, cpu_info(), graphs_on) is model
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert graphs.apply_hpu_graphs(model, cpu_info(), graphs_on) is False
        assert graphs.compile_model(model, cpu_info(), graphs_on) is model
        assert graphs.compile_model(model, cpu_info(), TrainingArguments()) is model


def test_args_module_does_not_import_torch():
    import subprocess
    import sys

    code = "import sys, gaudi_launch.runtime.args; print('torch' in sys.modules)"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.stdout.strip() == "False", res.stderr
