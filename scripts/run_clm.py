"""Causal language modelling (GPT-2 family) with gaudi_launch's runtime: the seed's main example.

Takes optimum-habana's run_clm.py flags, e.g.
    gaudi-launch --num_devices 2 scripts/run_clm.py --model_name_or_path gpt2-xl \\
        --gaudi_config_name Habana/gpt2 --do_train --do_eval --output_dir runs/clm \\
        --learning_rate 4e-04 --per_device_train_batch_size 16 --gradient_checkpointing \\
        --num_train_epochs 1 --use_habana --use_lazy_mode --throughput_warmup_steps 3
Offline, the model comes from a local config directory or checkpoint (a hub name is tried only when
the hub is reachable: here it is not, and you get a clear message). With no data flags it trains on
the small public-domain corpus and tokenizer shipped in gaudi_launch/runtime/assets.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Optional

from gaudi_launch.runtime.args import TrainingArguments, parse_args


@dataclass
class ModelArguments:
    model_name_or_path: Optional[str] = None  # a local checkpoint directory
    config_name: Optional[str] = None  # a local config directory (trained from scratch)
    tokenizer_name: Optional[str] = None  # a local tokenizer directory; default: the shipped one
    use_cache: bool = False
    model_type: Optional[str] = None  # from scratch: gpt2 (the shipped tiny config) is the one here
    config_overrides: Optional[str] = None  # "n_embd=10,n_layer=2": applied to the config from scratch


@dataclass
class DataArguments:
    dataset_name: Optional[str] = None
    dataset_config_name: Optional[str] = None
    train_file: Optional[str] = None
    validation_file: Optional[str] = None
    validation_split_percentage: int = 10
    block_size: int = 64
    max_train_samples: Optional[int] = None
    max_eval_samples: Optional[int] = None
    streaming: bool = False  # accepted: the offline corpus is read into memory anyway


def build_model(margs: ModelArguments, vocab_size: int):
    from transformers import AutoConfig, AutoModelForCausalLM

    from gaudi_launch.runtime.data import ASSETS
    from gaudi_launch.runtime.examples import note

    source = margs.model_name_or_path
    if source and os.path.isdir(source):
        return AutoModelForCausalLM.from_pretrained(source)
    config_dir = margs.config_name or (source if source and os.path.isdir(source) else None)
    if config_dir is None:
        if source:
            note(
                f"run_clm: '{source}' is not a local directory and the hub is not reachable here: "
                "training the shipped tiny GPT-2 from scratch instead (pass --config_name DIR or "
                "--model_name_or_path DIR for another model)",
            )
        config_dir = os.path.join(ASSETS, "tiny-gpt2")
    config = AutoConfig.from_pretrained(config_dir)
    if margs.model_type and margs.model_type != config.model_type:
        raise SystemExit(
            f"run_clm.py: error: --model_type {margs.model_type}: only {config.model_type} "
            "(the shipped tiny config) can be built offline here; pass --config_name DIR"
        )
    if margs.config_overrides:
        config.update_from_string(margs.config_overrides)  # as transformers' run_clm
    if config.vocab_size != vocab_size:
        config.vocab_size = vocab_size
    return AutoModelForCausalLM.from_config(config)


def main(argv=None) -> int:
    margs, dargs, targs = parse_args((ModelArguments, DataArguments, TrainingArguments), argv)
    from gaudi_launch.runtime import data
    from gaudi_launch.runtime.device import DeviceUnavailable, select_device
    from gaudi_launch.runtime.examples import refusing_bad_configs, saved_tokenizer, train_and_evaluate
    from gaudi_launch.runtime.trainer import Trainer, set_seed
    from gaudi_launch.runtime.zero_init import prepare_deepspeed

    try:
        select_device(targs)  # before any data or model work: --use_habana without a Gaudi stops here
    except DeviceUnavailable as exc:
        print(f"run_clm.py: error: {exc}", file=sys.stderr)
        return 2

    if dargs.dataset_name:
        texts = data.load_dataset_by_name(dargs.dataset_name, dargs.dataset_config_name)
    else:
        texts = data.load_text_files(dargs.train_file, dargs.validation_file, dargs.validation_split_percentage)
    tokenizer = data.load_tokenizer(margs.tokenizer_name or saved_tokenizer(margs.model_name_or_path))
    train_blocks = data.tokenize_and_group(texts["train"], tokenizer, dargs.block_size)
    eval_blocks = data.tokenize_and_group(texts["validation"], tokenizer, dargs.block_size)
    if dargs.max_train_samples:
        train_blocks = train_blocks[: dargs.max_train_samples]
    if dargs.max_eval_samples:
        eval_blocks = eval_blocks[: dargs.max_eval_samples]
    with refusing_bad_configs("run_clm.py"):  # a config that contradicts the flags: exit 2 before training
        prepare_deepspeed(targs)  # --deepspeed with ZeRO-3: the model is built partitioned (zero.Init)
        set_seed(targs.seed)  # the same initial weights in every run, as HF's examples do
        model = build_model(margs, len(tokenizer))
        model.config.use_cache = margs.use_cache
        if getattr(model, "loss_type", "") is None:
            # transformers 5 derives it from the class name, which GPT2LMHeadModel does not match; it
            # falls back to the causal-LM loss anyway, but warns on every rank.
            model.loss_type = "ForCausalLM"
        trainer = Trainer(
            model,
            targs,
            train_dataset=data.BlockDataset(train_blocks),
            eval_dataset=data.BlockDataset(eval_blocks),
            data_collator=data.causal_lm_collator,
            tokens_per_sample=dargs.block_size,
        )
    train_and_evaluate(trainer, tokenizer, targs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
