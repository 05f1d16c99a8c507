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


class DeepSpeedConfigError(ValueError):
    """A --deepspeed config that cannot be used as it is; the message says what to change."""


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


def _node(config: dict[str, Any], path: str) -> tuple[Optional[dict], str]:
    """(the dict holding the dotted ``path``'s last key, that key), or (None, key) when a parent is absent."""
    *parents, key = path.split(".")
    node: Any = config
    for part in parents:
        node = node.get(part)
        if not isinstance(node, dict):
            return None, key
    return node, key


def _fill(config: dict[str, Any], path: str, value: Any) -> None:
    """Set the value at dotted ``path`` when it is "auto" there (a value the user wrote stands)."""
    node, key = _node(config, path)
    if node is not None and node.get(key) == AUTO:
        node[key] = value


def _fill_match(config: dict[str, Any], path: str, value: Any, flag: str, mismatches: list[str]) -> None:
    """_fill, and a value written there that is not the flag's is noted in ``mismatches`` (transformers'
    HfTrainerDeepSpeedConfig.fill_match: DeepSpeed would train with the config's value, the Trainer
    computes with the flag's)."""
    node, key = _node(config, path)
    if node is None:
        return
    written = node.get(key)
    if written == AUTO:
        node[key] = value
    elif written is not None and written != value:
        mismatches.append(f"  {path} is {json.dumps(written)} but {flag} is {json.dumps(value)}")


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
    mismatches: list[str] = []
    for path, value, flag in [
        ("train_micro_batch_size_per_gpu", micro, "--per_device_train_batch_size"),
        ("gradient_accumulation_steps", accum, "--gradient_accumulation_steps"),
        ("train_batch_size", micro * accum * world, f"the batch x accumulation x {world} ranks"),
        ("gradient_clipping", args.max_grad_norm, "--max_grad_norm"),
        ("bf16.enabled", bool(args.bf16), "--bf16"),
        ("fp16.enabled", False, "fp16 (not supported here)"),
        ("optimizer.params.lr", args.learning_rate, "--learning_rate"),
        ("optimizer.params.betas", [args.adam_beta1, args.adam_beta2], "--adam_beta1/--adam_beta2"),
        ("optimizer.params.eps", args.adam_epsilon, "--adam_epsilon"),
        ("optimizer.params.weight_decay", args.weight_decay, "--weight_decay"),
        ("scheduler.params.warmup_max_lr", args.learning_rate, "--learning_rate"),
    ]:
        _fill_match(out, path, value, flag, mismatches)
    _fill(out, "scheduler.params.warmup_min_lr", 0)  # no flag of its own (as transformers: fill only)
    if total_steps is not None:  # both depend on the run's length (--warmup_ratio)
        # At least 1: DeepSpeed 0.19.6 and later refuse warmup_num_steps 0 (transformers 5 does the same).
        warm = max(1, warmup_steps(args, total_steps))
        _fill_match(out, "scheduler.params.warmup_num_steps", warm, "--warmup_steps (or --warmup_ratio)", mismatches)
        _fill_match(out, "scheduler.params.total_num_steps", total_steps, "the run's optimizer steps", mismatches)
    if mismatches:
        # Every contradiction at once, before any rank trains: as transformers' trainer_config_finalize.
        raise DeepSpeedConfigError(
            "--deepspeed: the config contradicts the training arguments (DeepSpeed would train with the "
            "config's values):\n" + "\n".join(mismatches) + '\nwrite "auto" for these keys, or make them agree'
        )
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
