"""ZeRO-3 from the model's first parameter: transformers builds it partitioned under DeepSpeed.

transformers' ``from_pretrained``/``from_config`` build a model inside ``deepspeed.zero.Init`` when a
``HfDeepSpeedConfig`` with ZeRO-3 is alive (``is_deepspeed_zero3_enabled``): each rank then allocates
only its partition of every parameter, and rank 0's initial weights are the ones every rank gets.
transformers' own TrainingArguments create that object as soon as they are parsed; ours are torch-free
(argument errors come before any import), so a script calls :func:`prepare_deepspeed` between parsing
and building the model, as the shipped examples do. The Trainer warns when a ZeRO-3 model was built
without it (whole on every rank).
"""

from __future__ import annotations

import os
from typing import Any, Optional

from gaudi_launch.runtime.device import init_distributed, select_device
from gaudi_launch.runtime.ds_config import load_ds_config, resolve_ds_config, zero_stage


def prepare_deepspeed(args: Any) -> Optional[Any]:
    """Under --deepspeed: register its config with transformers, so that models built from now on
    follow it (ZeRO-3: partitioned, under zero.Init); a no-op without --deepspeed. Returns the
    ``HfDeepSpeedConfig``, which also stays on ``args.hf_deepspeed_config`` (transformers holds it
    only by a weak reference, as it does for its TrainingArguments)."""
    if not args.deepspeed:
        return None
    existing = getattr(args, "hf_deepspeed_config", None)
    if existing is not None:
        return existing
    from transformers.integrations import HfDeepSpeedConfig

    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    # Batch sizes and precision now; what the data and the model decide stays "auto" until the Trainer.
    config = resolve_ds_config(load_ds_config(args.deepspeed), args, world, None, None, complete=False)
    if zero_stage(config) == 3:
        # zero.Init partitions over the process group: ours, with our backend, not one DeepSpeed picks;
        # DeepSpeed's comm layer must wrap it already, or zero.Init reads its config for a world of 1
        # (and refuses a train_batch_size made for all ranks). accelerate starts it this early for HF.
        import deepspeed

        info = select_device(args)
        init_distributed(info, args.ddp_timeout)
        deepspeed.init_distributed(dist_backend=info.dist_backend)
    hf_config = HfDeepSpeedConfig(config)
    args.hf_deepspeed_config = hf_config
    return hf_config


def built_partitioned(model: Any) -> bool:
    """Whether a model's parameters were made ZeRO-3 partitions when built (zero.Init tags each)."""
    return all(hasattr(p, "ds_id") for p in model.parameters())
