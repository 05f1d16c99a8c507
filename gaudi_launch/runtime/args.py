"""Training arguments, an HfArgumentParser-style parser and the Gaudi config, without torch (the parser's
rules and GaudiConfig live in gaudi_launch/scriptflags.py, shared with the rank bootstrap; named here too).

Scripts written for optimum-habana (run_clm.py and friends) keep their command lines: the field
names and defaults are GaudiTrainingArguments'. Torch is not imported here so that argument errors
show up in a fraction of a second, before any rank pays for importing torch.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

from gaudi_launch.scriptflags import (  # noqa: F401  (part of this module's API)
    CONFIG_NAME,
    GaudiConfig,
    build_parser,
    shipped_gaudi_configs,
)


def _opt(default: Any, help: str = "", choices: Optional[Sequence[Any]] = None) -> Any:
    meta: dict[str, Any] = {"help": help}
    if choices is not None:
        meta["choices"] = tuple(choices)
    return field(default=default, metadata=meta)


def _refused(default: Any, why: str, allowed: Sequence[Any] = ()) -> Any:
    """A flag of optimum-habana's or transformers' that this runtime does not implement: its default (and
    `allowed`, values that ask for what the runtime does anyway) pass; any other value is an error saying why."""
    return field(default=default, metadata={"help": f"not supported: {why}", "refused": why, "allowed": tuple(allowed)})


# AdamW in fp32 state under another name: what the runtime trains with (paged_: bitsandbytes pages the same
# state between host and device memory, a memory matter only).
ADAMW_OPTIMS = ("adamw_torch", "adamw_torch_fused", "adamw_hf", "adamw", "paged_adamw_32bit")


def refusals(args: Any) -> dict[str, str]:
    """{flag: message} for each flag set to a value this runtime does not implement. Pure."""
    out = {}
    for f in dataclasses.fields(args):
        why = f.metadata.get("refused")
        value = getattr(args, f.name)
        if why is not None and value != f.default and value not in f.metadata["allowed"]:
            out[f.name] = f"--{f.name} {value} is not supported by gaudi-launch's runtime: {why}"
    optim = getattr(args, "optim", "adamw_torch")
    if optim not in ADAMW_OPTIMS:
        out["optim"] = (
            f"--optim {optim} is not supported by gaudi-launch's runtime: it trains with torch's AdamW "
            f"(fused on HPU when the gaudi config asks); pass one of {', '.join(ADAMW_OPTIMS)}"
        )
    return out


def absolute_steps(value: float, num_training_steps: int) -> int:
    """A step count given as transformers 5 takes it: 1 or more, that many steps; below 1, that fraction of
    the run's optimizer steps, rounded up (TrainerState.compute_steps, TrainingArguments.get_warmup_steps).
    Pure."""
    return int(value) if value >= 1 else math.ceil(num_training_steps * value)


def warmup_steps(args: Any, num_training_steps: int) -> int:
    """Warm-up steps: --warmup_steps as transformers 5 reads it (a float below 1 is a fraction of the run's
    optimizer steps); when it is 0, ceil(--warmup_ratio x the steps), optimum-habana 1.21.2's flag. Pure."""
    if getattr(args, "warmup_steps", 0) > 0:
        return absolute_steps(args.warmup_steps, num_training_steps)
    return math.ceil(num_training_steps * getattr(args, "warmup_ratio", 0.0))


@dataclass
class TrainingArguments:
    """GaudiTrainingArguments' names and defaults (the subset this runtime implements)."""

    output_dir: str = _opt("runs/out", "where checkpoints and logs go")
    overwrite_output_dir: bool = _opt(
        False,
        "accepted, and what the runtime always does: an existing output_dir is written into and a run resumes "
        "only with --resume_from_checkpoint (or a launcher restart)",
    )
    do_train: bool = _opt(False)
    do_eval: bool = _opt(False)
    use_habana: bool = _opt(
        False,
        "run on a Gaudi: an error, before training, when none is usable here "
        "(--device cpu, or gaudi-launch --device cpu, overrides it)",
    )
    use_lazy_mode: Optional[bool] = _opt(
        None,
        "HPU lazy mode (PT_HPU_LAZY_MODE=1); false or --torch_compile: eager. Default: the user's "
        "PT_HPU_LAZY_MODE, else the Gaudi software's own default",
    )
    use_hpu_graphs_for_training: bool = _opt(False, "HPU graphs (CUDA graphs via torch.compile on CUDA)")
    distribution_strategy: str = _opt("ddp", choices=("ddp", "fast_ddp"))
    bf16: bool = _opt(False, "bfloat16 autocast")
    half_precision_backend: str = _opt("hpu_amp", choices=("hpu_amp", "cpu_amp", "auto"))
    throughput_warmup_steps: int = _opt(0, "steps left out of the throughput figures")
    pipelining_fwd_bwd: bool = _opt(False, "mark_step between forward and backward (HPU lazy mode)")
    non_blocking_data_copy: bool = _opt(False)
    dataloader_num_workers: int = _opt(0)
    dataloader_drop_last: bool = _opt(False)
    dataloader_pin_memory: bool = _opt(True)
    gradient_checkpointing: bool = _opt(False)
    gradient_accumulation_steps: int = _opt(1)
    logging_steps: float = _opt(
        500, "log every N optimizer steps; below 1, that fraction of the run's steps (transformers 5's default 500)"
    )
    max_steps: int = _opt(-1, "overrides num_train_epochs when > 0")
    num_train_epochs: float = _opt(3.0)
    learning_rate: float = _opt(5e-5)
    weight_decay: float = _opt(0.0)
    warmup_steps: float = _opt(0, "linear warm-up steps; below 1, that fraction of the run's steps (transformers 5)")
    warmup_ratio: float = _opt(0.0, "warm-up over this fraction of the optimizer steps (when --warmup_steps is 0)")
    lr_scheduler_type: str = _opt("linear", choices=("linear", "constant", "constant_with_warmup", "cosine"))
    per_device_train_batch_size: int = _opt(8)
    per_device_eval_batch_size: int = _opt(8)
    max_grad_norm: float = _opt(1.0)
    adam_beta1: float = _opt(0.9)
    adam_beta2: float = _opt(0.999)
    adam_epsilon: float = _opt(1e-6, "optimum-habana's default (HF's is 1e-8)")
    seed: int = _opt(42)
    data_seed: Optional[int] = _opt(None, "the training data's shuffling seed (as HF's); default: --seed")
    average_tokens_across_devices: bool = _opt(
        True,
        "normalise each optimizer step's loss by its scored tokens over all ranks, as HF's Trainer does "
        "(false: over this rank's)",
    )
    save_strategy: str = _opt(
        "steps",
        "checkpoint every --save_steps optimizer steps, at each epoch's end, or never",
        ("steps", "epoch", "no"),
    )
    save_steps: int = _opt(500)
    save_total_limit: Optional[int] = _opt(None)
    resume_from_checkpoint: Optional[str] = _opt(None)
    torch_compile: bool = _opt(False)
    torch_compile_backend: Optional[str] = _opt(
        None, "torch.compile's backend; implies --torch_compile. Default: hpu_backend on HPU, else inductor"
    )
    deepspeed: Optional[str] = _opt(None, "DeepSpeed config file")
    gaudi_config_name: Optional[str] = _opt(None, "gaudi_config.json path/dir or a shipped name (Habana/gpt2)")
    device: Optional[str] = _opt(
        None, "default: hpu if habana_frameworks imports, else cuda, else cpu", choices=("hpu", "cuda", "cpu")
    )
    fast_ddp_buffer_dtype: Optional[str] = _opt(None, "default: bf16 on HPU, fp32 elsewhere", choices=("bf16", "fp32"))
    fused_kernels: bool = _opt(
        True,
        "off HPU, swap a model's slow modules for fused torch equivalents (GPT-2's "
        "gelu_new: one F.gelu kernel, equal up to rounding); false keeps the model's own",
    )
    mlm_head_masked_only: bool = _opt(
        True,
        "off HPU, BERT's masked-LM head and loss run on the masked positions only, as BERT's own "
        "pre-training does (the same loss and gradients; in training the output's logits are those "
        "positions' only); false runs the head on every position",
    )
    report_to: str = _opt("none")
    ddp_timeout: int = _opt(1800, "seconds")
    attn_implementation: Optional[str] = _opt(
        None,
        "attention kernel; gaudi_fused_sdpa is Gaudi's FusedSDPA (torch SDPA off HPU); default: the model's own",
        choices=("eager", "sdpa", "gaudi_fused_sdpa"),
    )
    use_flash_attention: bool = _opt(False, "older optimum-habana spelling of --attn_implementation gaudi_fused_sdpa")
    flash_attention_recompute: bool = _opt(False, "FusedSDPA recomputes in backward instead of storing (less memory)")
    flash_attention_causal_mask: bool = _opt(False, "FusedSDPA applies the causal mask itself; padding masks dropped")
    flash_attention_fast_softmax: bool = _opt(False, "FusedSDPA's fast (reduced-precision) softmax")
    local_rank: int = _opt(-1, "accepted for --local_rank compatibility; LOCAL_RANK from the env wins")
    eval_strategy: str = _opt(
        "no", "evaluate during training: every eval_steps, or after each epoch", choices=("no", "steps", "epoch")
    )
    evaluation_strategy: Optional[str] = _opt(None, "older name of --eval_strategy", choices=("no", "steps", "epoch"))
    eval_steps: Optional[float] = _opt(
        None, "with --eval_strategy steps; below 1, a fraction of the run's steps; default: logging_steps"
    )
    eval_delay: float = _opt(
        0.0, "no evaluation before this many optimizer steps (or epochs, with --eval_strategy epoch)"
    )
    logging_first_step: bool = _opt(False)
    # ---- the rest of optimum-habana 1.21.2's GaudiTrainingArguments (same names and defaults) ----
    use_hpu_graphs_for_inference: bool = _opt(False, "HPU graphs for evaluation (lazy mode)")
    use_hpu_graphs: bool = _opt(False, "older name of --use_hpu_graphs_for_inference")
    disable_tensor_cache_hpu_graphs: bool = _opt(False, "HPU graphs for inference keep no tensor cache")
    max_hpu_graphs: Optional[int] = _opt(None, "most HPU graphs kept for inference")
    adjust_throughput: bool = _opt(
        False, "leave logging and saving time out of the throughput too (evaluation time is always left out)"
    )
    logging_nan_inf_filter: bool = _opt(
        False,
        "as transformers: a nan/inf micro-batch loss is logged as the mean since the last log, a nan/inf eval "
        "batch loss is left out of eval_loss (training is unchanged); off by default, as in optimum-habana",
    )
    ddp_bucket_cap_mb: Optional[int] = _opt(230, "DDP bucket size (distribution_strategy ddp)")
    ddp_find_unused_parameters: Optional[bool] = _opt(False, "DDP find_unused_parameters")
    compile_dynamic: Optional[bool] = _opt(None, "torch.compile dynamic= (None: torch decides)")
    cache_size_limit: Optional[int] = _opt(None, "torch._dynamo cache_size_limit with --torch_compile")
    sdp_on_bf16: bool = _opt(False, "allow bf16 reductions in torch's math SDPA")
    optim: str = _opt(
        "adamw_torch", "AdamW (fused on HPU when the gaudi config asks); other optimizers: accepted, AdamW is used"
    )
    inline_inbuilt_nn_modules: Optional[bool] = _opt(
        None, "torch._dynamo.config.inline_inbuilt_nn_modules with --torch_compile (None: torch's default)"
    )
    allow_unspec_int_on_nn_module: Optional[bool] = _opt(
        None, "torch._dynamo.config.allow_unspec_int_on_nn_module with --torch_compile (None: torch's default)"
    )
    # ---- refused away from their defaults: each says why (tests/runtime/test_optimum_flags.py parses every
    # optimum-habana 1.21.2 example command line against these) ----
    use_compiled_autograd: bool = _refused(False, "torch's compiled autograd is not wired in; drop the flag")
    compile_from_sec_iteration: bool = _refused(
        False, "the model is compiled before the first step (--throughput_warmup_steps leaves that step out)"
    )
    use_zero3_leaf_promotion: bool = _refused(
        False, "ZeRO-3 leaf modules (DeepSpeed's set_z3_leaf_modules, for mixture-of-experts layers) are not set"
    )
    use_regional_compilation: bool = _refused(
        False, "--torch_compile compiles the whole model, not each repeated layer; drop the flag"
    )
    context_parallel_size: int = _refused(1, "context parallelism is not implemented: ranks are data-parallel")
    minimize_memory: bool = _refused(False, "it is an fp8 training option, and fp8 is not supported")
    ignore_eos: bool = _refused(True, "it is for optimum-habana's generation benchmarks; generation here stops at EOS")
    profiling_warmup_steps: int = _refused(0, "the profiler is not wired in; wrap trainer.train() in torch.profiler")
    profiling_steps: int = _refused(0, "the profiler is not wired in; wrap trainer.train() in torch.profiler")
    profiling_warmup_steps_eval: int = _refused(0, "the profiler is not wired in; wrap evaluate() in torch.profiler")
    profiling_steps_eval: int = _refused(0, "the profiler is not wired in; wrap evaluate() in torch.profiler")
    profiling_record_shapes: bool = _refused(True, "the profiler is not wired in")
    profiling_with_stack: bool = _refused(False, "the profiler is not wired in")
    flash_attention_fp8: bool = _refused(
        False, "fp8 needs Habana's Transformer Engine, which this runtime does not use"
    )
    fp8: bool = _refused(False, "fp8 needs Habana's Transformer Engine, which this runtime does not use")
    # ---- transformers' TrainingArguments (4.55, optimum-habana's, and 5.x) that the example commands use ----
    logging_strategy: str = _refused(
        "steps", "the loss is logged every --logging_steps optimizer steps; set that instead"
    )
    bf16_full_eval: bool = _refused(
        False, "evaluation runs in the training's precision (--bf16: under bf16 autocast); the model is not cast"
    )
    do_predict: bool = _refused(False, "the example scripts have no test split to predict on; use --do_eval")
    fsdp: Optional[str] = _refused(None, "FSDP is not implemented; shard with --deepspeed and a ZeRO-3 config")
    fsdp_config: Optional[str] = _refused(None, "FSDP is not implemented; shard with --deepspeed and a ZeRO-3 config")
    push_to_hub: bool = _refused(False, "the runtime does not upload to the Hugging Face Hub; upload output_dir")
    hub_model_id: Optional[str] = _refused(None, "the runtime does not upload to the Hugging Face Hub")
    push_to_hub_model_id: Optional[str] = _refused(None, "the runtime does not upload to the Hugging Face Hub")
    run_name: Optional[str] = _refused(
        None, "it names a run for experiment trackers, which the runtime does not report to (see output_dir)"
    )
    label_names: Optional[list[str]] = _refused(
        None, "the loss is the model's own, from the batch's 'labels'", allowed=(["labels"],)
    )
    load_best_model_at_end: bool = _refused(
        False, "the best checkpoint is not tracked; checkpoints rotate by --save_total_limit, newest kept"
    )
    metric_for_best_model: Optional[str] = _refused(None, "the best checkpoint is not tracked")
    remove_unused_columns: bool = _opt(
        True,
        "accepted: the batch goes to the model as the script's collator builds it, no column removed "
        "(what false asks; the shipped collators build model inputs only)",
    )
    adafactor: bool = _refused(False, "the runtime trains with AdamW")

    def __post_init__(self) -> None:
        # Direct construction gets the same checks as the command line.
        for f in dataclasses.fields(self):
            choices = f.metadata.get("choices")
            value = getattr(self, f.name)
            if choices and value is not None and value not in choices:
                raise ValueError(f"{f.name}={value!r}: expected one of {', '.join(map(str, choices))}")
        if self.gradient_accumulation_steps < 1:
            raise ValueError("gradient_accumulation_steps must be >= 1")
        # transformers 5's rules (TrainingArguments.__post_init__): a fraction below 1, else a whole number.
        if self.logging_steps <= 0:
            raise ValueError(f"--logging_steps {self.logging_steps}: must be above 0 (a fraction below 1 or steps)")
        if self.logging_steps > 1 and self.logging_steps != int(self.logging_steps):
            raise ValueError(f"--logging_steps must be an integer if bigger than 1: {self.logging_steps}")
        if self.warmup_steps < 0:
            raise ValueError(f"--warmup_steps {self.warmup_steps}: must be 0 or more")
        if self.logging_steps >= 1:
            self.logging_steps = int(self.logging_steps)
        if self.evaluation_strategy and self.eval_strategy == "no":
            self.eval_strategy = self.evaluation_strategy
        if self.eval_strategy == "steps" and not self.eval_steps:
            self.eval_steps = self.logging_steps
        elif self.eval_steps and self.eval_strategy != "steps":
            warnings.warn(
                f"--eval_steps {self.eval_steps} has no effect with --eval_strategy {self.eval_strategy} "
                "(add --eval_strategy steps)",
                stacklevel=3,
            )
        if self.use_hpu_graphs:
            self.use_hpu_graphs_for_inference = True
        refused = refusals(self)
        if refused:
            raise ValueError("\n".join(refused.values()))
        if self.torch_compile_backend is not None:
            self.torch_compile = True  # as transformers' TrainingArguments
        if self.use_flash_attention:
            if self.attn_implementation not in (None, "gaudi_fused_sdpa"):
                raise ValueError(
                    f"--use_flash_attention asks for gaudi_fused_sdpa but --attn_implementation is "
                    f"{self.attn_implementation}: pass only one of them"
                )
            self.attn_implementation = "gaudi_fused_sdpa"
        flash = [
            f"--{name}"
            for name in ("flash_attention_recompute", "flash_attention_causal_mask", "flash_attention_fast_softmax")
            if getattr(self, name)
        ]
        if flash and self.attn_implementation != "gaudi_fused_sdpa":
            raise ValueError(
                f"{', '.join(flash)} only apply to Gaudi's fused attention: add --attn_implementation gaudi_fused_sdpa"
            )


# ----------------------------------------------------------------------------------------------
# Parser (build_parser and GaudiConfig: gaudi_launch/scriptflags.py, which the rank bootstrap reads too)


def parse_args(dataclass_types: tuple[type, ...], argv: Optional[list[str]] = None) -> tuple:
    """Fill each dataclass from one command line, like HfArgumentParser.parse_args_into_dataclasses.

    Unknown arguments exit with status 2 and argparse's message naming them.
    """
    if isinstance(dataclass_types, type):
        dataclass_types = (dataclass_types,)
    parser = build_parser(dataclass_types)
    ns = parser.parse_args(sys.argv[1:] if argv is None else list(argv))
    out = []
    for cls in dataclass_types:
        values = {f.name: getattr(ns, f.name) for f in dataclasses.fields(cls) if f.init}
        try:
            out.append(cls(**values))
        except ValueError as exc:
            parser.error(str(exc))
    return tuple(out)
