"""DeepSpeed configs with "auto" values, filled from the training arguments as transformers does it.

optimum-habana's example configs (tests/configs/deepspeed_zero_2.json and the language-modeling
ones) leave batch sizes, accumulation, precision and optimizer/scheduler settings to "auto":
HF's ``HfTrainerDeepSpeedConfig.trainer_config_process`` fills them from the TrainingArguments so
the two cannot disagree. This does the same; an "auto" left that nothing here can fill is an error
naming its key. Torch-free and pure.
"""

from __future__ import annotations

import copy
import json
from typing import Any, Optional

from .args import warmup_steps

AUTO = "auto"


def load_ds_config(config: Any) -> dict[str, Any]:
    """A DeepSpeed config from a path or a dict (a copy: the caller's is never changed)."""
    if isinstance(config, dict):
        return copy.deepcopy(config)
    try:
        with open(config) as f:
            data = json.load(f)
    except OSError as exc:
        raise ValueError(f"--deepspeed {config}: cannot read it ({exc.strerror})") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"--deepspeed {config}:{exc.lineno}: not valid JSON: {exc.msg}") from None
    if not isinstance(data, dict):
        raise ValueError(f"--deepspeed {config}: expected a JSON object")
    return data


def _fill(config: dict[str, Any], path: str, value: Any) -> None:
    """Set the value at dotted ``path`` when it is "auto" there (a value the user wrote stands)."""
    *parents, key = path.split(".")
    node = config
    for part in parents:
        node = node.get(part)
        if not isinstance(node, dict):
            return
    if node.get(key) == AUTO:
        node[key] = value


def _autos(node: Any, prefix: str = "") -> list[str]:
    if isinstance(node, dict):
        return [p for k, v in node.items() for p in _autos(v, f"{prefix}{k}.")]
    return [prefix.rstrip(".")] if node == AUTO else []


def resolve_ds_config(
    config: dict[str, Any],
    args: Any,
    world: int,
    total_steps: Optional[int],
    hidden_size: Optional[int] = None,
    complete: bool = True,
) -> dict[str, Any]:
    """``config`` with every "auto" filled from ``args`` (TrainingArguments); a new dict.

    ``total_steps`` is the run's optimizer steps (for a scheduler's total_num_steps);
    ``hidden_size`` the model's (for ZeRO's bucket sizes), when known. ``complete=False``: the
    config for building the model under ZeRO-3, before either is known (as transformers'
    ``trainer_config_process``): what they fill stays "auto", which DeepSpeed reads as its default.
    """
    out = copy.deepcopy(config)
    accum = max(1, args.gradient_accumulation_steps)
    micro = args.per_device_train_batch_size
    for key, flag, ours in (
        ("train_micro_batch_size_per_gpu", "per_device_train_batch_size", micro),
        ("gradient_accumulation_steps", "gradient_accumulation_steps", accum),
    ):
        if out.get(key, AUTO) != AUTO and out[key] != ours:
            # DeepSpeed would batch differently from the data loader: HF refuses this too.
            raise ValueError(
                f"--deepspeed: {key} is {out[key]} but --{flag} is {ours}: make them agree, "
                f'or write "auto" in the config'
            )
    for path, value in [
        ("train_micro_batch_size_per_gpu", micro),
        ("gradient_accumulation_steps", accum),
        ("train_batch_size", micro * accum * world),
        ("gradient_clipping", args.max_grad_norm),
        ("bf16.enabled", bool(args.bf16)),
        ("fp16.enabled", False),
        ("optimizer.params.lr", args.learning_rate),
        ("optimizer.params.betas", [args.adam_beta1, args.adam_beta2]),
        ("optimizer.params.eps", args.adam_epsilon),
        ("optimizer.params.weight_decay", args.weight_decay),
        ("scheduler.params.warmup_min_lr", 0),
        ("scheduler.params.warmup_max_lr", args.learning_rate),
    ]:
        _fill(out, path, value)
    if total_steps is not None:  # both depend on the run's length (--warmup_ratio)
        _fill(out, "scheduler.params.warmup_num_steps", warmup_steps(args, total_steps))
        _fill(out, "scheduler.params.total_num_steps", total_steps)
    if hidden_size:
        _fill(out, "zero_optimization.reduce_bucket_size", hidden_size * hidden_size)
        _fill(out, "zero_optimization.stage3_prefetch_bucket_size", int(0.9 * hidden_size * hidden_size))
        _fill(out, "zero_optimization.stage3_param_persistence_threshold", 10 * hidden_size)
    left = _autos(out)
    if left and complete:
        raise ValueError(f'--deepspeed: no value to fill "auto" with for {", ".join(left)}: set it in the config')
    if "optimizer" not in out:
        # The Trainer hands its own optimizer to DeepSpeed, which ZeRO accepts only when told to.
        out.setdefault("zero_allow_untested_optimizer", True)
    return out


def zero_stage(config: dict[str, Any]) -> int:
    """The config's ZeRO stage (0 without a zero_optimization block). Pure."""
    zero = config.get("zero_optimization")
    return int(zero.get("stage", 0)) if isinstance(zero, dict) else 0
