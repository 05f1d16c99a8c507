"""A lean Trainer that applies each Gaudi acceleration on the device that has it.

HPU: lazy mode (mark_step placement as optimum-habana does it), HPU graphs, fast_ddp, bf16 autocast,
fused AdamW and clip norm. CUDA: the same ideas with nccl, torch.compile/CUDA graphs, fused AdamW.
CPU (gloo): everything that means something there, for real. Throughput excludes warm-up steps.
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import sys
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from gaudi_launch.runtime import checkpoint as ckpt
from gaudi_launch.runtime.args import GaudiConfig, TrainingArguments, absolute_steps
from gaudi_launch.runtime.attention import apply_attention
from gaudi_launch.runtime.device import (
    DeviceInfo,
    init_distributed,
    mark_step,
    memory_stats,
    prepare_hpu_env,
    select_device,
    set_dynamic_shapes,
)
from gaudi_launch.runtime.ds_config import load_ds_config, resolve_ds_config, zero_stage
from gaudi_launch.runtime.fast_ddp import FastDDP
from gaudi_launch.runtime.graphs import InferenceGraphs, apply_hpu_graphs, compile_model, mark_batch_dynamic
from gaudi_launch.runtime.kernels import use_fused_kernels
from gaudi_launch.runtime.masked_head import use_masked_only_head
from gaudi_launch.runtime.masks import check_padding_once, prepare_masks
from gaudi_launch.runtime.metrics import MetricsWriter, Throughput, format_log
from gaudi_launch.runtime.optim import clip_flat_grad_norm, clip_grad_norm, make_optimizer, make_scheduler
from gaudi_launch.runtime.precision import autocast
from gaudi_launch.runtime.sampling import (
    DealtBatches,
    batches_per_rank,
    samples_in_round,
    steps_per_epoch,
    window_sizes,
    windows_after,
)
from gaudi_launch.runtime.zero_init import built_partitioned, prepare_deepspeed
from gaudi_launch.wire import beat, restart_count


@dataclass
class TrainOutput:
    global_step: int
    train_loss: float
    metrics: dict[str, float] = field(default_factory=dict)


_BUFFER_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}  # --fast_ddp_buffer_dtype


class _EngineScheduler:
    """DeepSpeed's own LR scheduler (a "scheduler" block in its config): engine.step() steps it."""

    def __init__(self, engine) -> None:
        self.engine = engine

    def step(self) -> None:
        pass

    def get_last_lr(self) -> list[float]:
        return list(self.engine.get_lr())

    def state_dict(self) -> dict:
        return self.engine.lr_scheduler.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.engine.lr_scheduler.load_state_dict(state)


def eval_batch_weight(
    index: int, batches: int, n: int, batch_size: int, world: int, rank: int, drop_last: bool = False
) -> int:
    """The samples a rank's eval batch counts for in HF's eval loss. Trainer.evaluation_loop repeats each
    batch's loss batch_size times and gathers it with accelerate's gather_for_metrics, which cuts the
    last round to the samples left (``remainder``: n modulo batch_size x world): the completion from the
    start of the set, and on one rank the short last batch's missing places, count for nothing (with
    drop_last nothing is cut: the short round is not there). Pure."""
    remainder = n % (batch_size * world)
    if index < batches - 1 or remainder == 0 or drop_last:
        return batch_size
    return min(max(remainder - rank * batch_size, 0), batch_size)


def perplexity(loss: float) -> float:
    """exp(eval loss), inf where that overflows, as transformers' run_clm.py computes it. Pure."""
    try:
        return math.exp(loss)
    except OverflowError:
        return float("inf")


def loss_shifts_labels(model: Any) -> bool:
    """Whether the model's loss predicts labels[..., 1:] (a causal LM's), so that position 0 is never
    scored: transformers' Trainer.__init__ (``_loss_shifts_labels``) asks its LOSS_MAPPING for the model's
    loss_type, encoder-decoders excepted."""
    try:
        from transformers.loss.loss_utils import LOSS_MAPPING, ForCausalLMLoss
    except ImportError:
        return False
    config = getattr(model, "config", None)
    return LOSS_MAPPING.get(getattr(model, "loss_type", None)) is ForCausalLMLoss and not getattr(
        config, "is_encoder_decoder", False
    )


def scored_tokens(batch: dict[str, Any], shifted: bool) -> Optional[int]:
    """Label positions a batch's loss scores (not -100; a causal LM's from position 1), counted on the host
    before the batch moves (Trainer._get_num_items_in_batch); None without labels. Pure."""
    labels = batch.get("labels") if isinstance(batch, dict) else None
    if not torch.is_tensor(labels):
        return None
    if shifted:
        labels = labels[..., 1:]
    return int(labels.ne(-100).sum())


def enable_checkpointing(model: torch.nn.Module) -> None:
    """Recompute activations in backward, non-reentrant (optimum-habana forces it too; its
    recomputation needs no mark_step of its own in lazy mode). transformers 5 renamed the method;
    the old name still works there but warns."""
    kwargs: dict[str, object] = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    elif hasattr(model, "gradient_checkpointing_enable"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    else:
        raise ValueError("--gradient_checkpointing needs a model that supports it (transformers models do)")


def set_seed(seed: int) -> None:
    """Python's, numpy's and torch's RNGs (HF's set_seed): call it before building a model, so its
    initial weights are the same in every run."""
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy as np

        np.random.seed(seed)
    except ImportError:
        pass


def grads_to_none(args: TrainingArguments, world: int) -> bool:
    """zero_grad(set_to_none=...) as optimum-habana decides it. Pure. Gradients are kept (zeroed)
    with fast_ddp, whose fused buffer views them, and with HPU graphs, which replay into fixed
    tensors; otherwise freeing them saves memory."""
    fast_ddp = world > 1 and args.distribution_strategy == "fast_ddp"
    return not fast_ddp and not args.use_hpu_graphs_for_training


def worker_start_method(kind: str, world: int, num_workers: int) -> Optional[str]:
    """How DataLoader workers start: "spawn" on HPU beyond 8 ranks, else None (the platform's default,
    fork on Linux). Pure. optimum-habana 1.21.2 does the same for every loader it prepares
    (optimum/habana/accelerate/accelerator.py, prepare_data_loader: WORLD_SIZE > 8 and num_workers > 0)
    against a crash Habana tracks as SW-207456 (multi-node training with loader workers): forked workers
    inherit a process that has loaded the bridge and opened its device, spawned ones start afresh."""
    return "spawn" if kind == "hpu" and world > 8 and num_workers > 0 else None


def evaluation_due(
    args: TrainingArguments,
    step: int,
    epoch_end: bool,
    epochs_done: int = 0,
    last_step: bool = False,
    max_steps: int = 0,
) -> bool:
    """Whether to evaluate now: every eval_steps optimizer steps and after the run's last step, or at the
    end of each epoch (a run stopped inside one ends it there); none before --eval_delay steps (epochs,
    with "epoch"), as transformers' DefaultFlowCallback decides; --eval_steps below 1 is a fraction of the
    run's `max_steps`. Pure."""
    delay = getattr(args, "eval_delay", 0)
    if args.eval_strategy == "steps":
        every = absolute_steps(args.eval_steps, max_steps) if args.eval_steps else 0
        due = bool(every) and (step % every == 0 or last_step)
        return not epoch_end and due and step >= delay
    return args.eval_strategy == "epoch" and epoch_end and epochs_done >= delay


def save_due(args: TrainingArguments, step: int, epoch_end: bool, last_step: bool = False) -> bool:
    """Whether to checkpoint now (--save_strategy): every save_steps optimizer steps and after the last
    step, at each epoch's end (a stop inside an epoch ends it), or never; as transformers'
    DefaultFlowCallback decides (on_step_end's save at the end, on_epoch_end). --save_steps 0 is ours:
    no checkpoint at all. Pure."""
    strategy = getattr(args, "save_strategy", "steps")
    if strategy == "steps":
        return not epoch_end and bool(args.save_steps) and (step % args.save_steps == 0 or last_step)
    return strategy == "epoch" and epoch_end


def multi_node_eval_warning(world: int, local_world: int) -> Optional[str]:
    """The multi-node guide's advice when evaluation spans nodes (None on one node). Pure."""
    if world <= max(1, local_world):
        return None
    return (
        "multi-node evaluation is not recommended: it can give inconsistent results. Train on several "
        "nodes, then evaluate the saved model on one node (run_clm.py: --model_name_or_path <output_dir> "
        "--do_eval, without --do_train)"
    )


@contextlib.contextmanager
def _deepspeed_unseen():
    """transformers' save_pretrained unwraps the model with accelerate, which imports DeepSpeed whenever it
    is installed (to test for its engine): seconds, and DeepSpeed's "Setting accelerator to CPU ... unable
    to detect it" warning in a run that never used it. Only a run that imported DeepSpeed can have wrapped
    a model in its engine: until then, accelerate is told it is absent."""
    try:  # not in the [train] extra: without accelerate, save_pretrained does not unwrap with it
        import accelerate.utils.other as unwrapping
    except ImportError:
        unwrapping = None
    if "deepspeed" in sys.modules or unwrapping is None:
        yield
        return

    found = unwrapping.is_deepspeed_available
    unwrapping.is_deepspeed_available = lambda: False
    try:
        yield
    finally:
        unwrapping.is_deepspeed_available = found


class Trainer:
    def __init__(
        self,
        model: torch.nn.Module,
        args: TrainingArguments,
        train_dataset=None,
        eval_dataset=None,
        data_collator: Optional[Callable] = None,
        gaudi_config: Optional[GaudiConfig] = None,
        tokens_per_sample: Optional[int] = None,
        log: Callable[[str], None] = print,
        on_step_end: Optional[Callable[[int], None]] = None,
        eval_metrics: Optional[
            Callable[[Any, dict[str, torch.Tensor]], dict[str, tuple[torch.Tensor, torch.Tensor]]]
        ] = None,
    ):
        self.args = args
        if gaudi_config is None:
            gaudi_config = (
                GaudiConfig.from_pretrained(args.gaudi_config_name) if args.gaudi_config_name else GaudiConfig()
            )
        self.gaudi_config = gaudi_config
        prepare_hpu_env(args, gaudi_config)  # before anything imports habana_frameworks
        self.info: DeviceInfo = select_device(args)
        self.rank, self.world = init_distributed(self.info, args.ddp_timeout)
        if args.torch_compile and self.info.kind == "hpu" and self.info.lazy:
            raise ValueError(
                "--torch_compile needs HPU eager mode but the bridge loaded in lazy mode "
                "(PT_HPU_LAZY_MODE=1): unset PT_HPU_LAZY_MODE (or set it to 0) and start again"
            )
        set_dynamic_shapes(self.info, self.gaudi_config.use_dynamic_shapes)
        if args.sdp_on_bf16:
            torch._C._set_math_sdp_allow_fp16_bf16_reduction(True)
        self.train_dataset, self.eval_dataset = train_dataset, eval_dataset
        self.collator = data_collator
        self.tokens_per_sample = tokens_per_sample
        self._log = log
        self.on_step_end = on_step_end
        # (model output, batch) -> {name: (numerator, denominator)} device tensors, summed over
        # batches and ranks: e.g. masked-token accuracy. No host sync per batch.
        self.eval_metrics = eval_metrics
        self._eval_warned = False
        set_seed(args.seed)
        apply_attention(model, args, self.info)
        check_padding_once(model, self.info)  # HPU: no host read of the input ids in every forward
        # Not under bf16 autocast: the model's own element-wise gelu rounds to bf16 after each op, the fused
        # kernel once, which moves a bf16 loss by about 1e-3 against transformers' (the bf16 equivalence case).
        use_fused_kernels(model, self.info, args.fused_kernels and not args.bf16)
        use_masked_only_head(model, self.info, args.mlm_head_masked_only, args.use_hpu_graphs_for_training)
        if args.gradient_checkpointing:
            enable_checkpointing(model)
        self.model = model.to(self.info.device)
        self.fast_ddp: Optional[FastDDP] = None
        self._ddp: Optional[torch.nn.parallel.DistributedDataParallel] = None  # the DDP wrapper, if any
        self.engine = None
        if args.deepspeed:
            self._init_deepspeed()
        else:
            self._init_plain()
        # A restart (--max-restarts) continues this run: its metrics so far stay.
        self.restart = restart_count(os.environ)
        if args.overwrite_output_dir and not args.resume_from_checkpoint and not self.restart and self.rank == 0:
            # A fresh run: earlier runs' metrics would otherwise be appended to.
            path = os.path.join(args.output_dir, "metrics.jsonl")
            if os.path.exists(path):
                os.remove(path)
        self.writer = MetricsWriter(args.output_dir, rank=self.rank)
        self.inference_graphs = InferenceGraphs(self.model, self.info, args)
        self._shifts: Optional[bool] = None  # whether the loss scores labels[..., 1:] (loss_shifts_labels)
        self._in_train = False
        self._max_steps = 0  # the run's optimizer steps, once train() knows them
        self._log_every, self._batches_per_epoch = 1, 1  # set by train()
        self._log_history: list[dict] = []  # rank 0's logs, for trainer_state.json (transformers' log_history)

    # ---- set-up --------------------------------------------------------------------------------
    def _init_plain(self) -> None:
        args, info = self.args, self.info
        # HPU graphs wrap the model itself, in place, before DDP (the bridge refuses a DDP module).
        apply_hpu_graphs(self.model, info, args)
        if self.world > 1 and args.distribution_strategy == "fast_ddp":
            dtype = args.fast_ddp_buffer_dtype or ("bf16" if info.kind == "hpu" else "fp32")
            self.fast_ddp = FastDDP(self.model, buffer_dtype=_BUFFER_DTYPES[dtype], wait=info.kind != "hpu")
            self.fast_ddp.broadcast_parameters()
            self.train_model = self.model
        elif self.world > 1:
            kwargs: dict[str, object] = {
                "bucket_cap_mb": args.ddp_bucket_cap_mb,
                "find_unused_parameters": bool(args.ddp_find_unused_parameters),
            }
            if info.kind == "cuda":
                kwargs["device_ids"] = [info.device.index]
            if info.kind == "hpu":
                kwargs["gradient_as_bucket_view"] = True  # as optimum-habana: no copy between grads and buckets
            self.train_model = self._ddp = torch.nn.parallel.DistributedDataParallel(self.model, **kwargs)
        else:
            self.train_model = self.model
        self.train_model = compile_model(self.train_model, info, args)
        self.optimizer = make_optimizer(self.model, args, info, self.gaudi_config)
        self._fused_clip = None

    def _init_deepspeed(self) -> None:
        import deepspeed

        args = self.args
        prepare_deepspeed(args)  # transformers keeps following the config (a no-op if the script called it)
        hidden = getattr(getattr(self.model, "config", None), "hidden_size", None)
        config = resolve_ds_config(load_ds_config(args.deepspeed), args, self.world, self._planned_steps(), hidden)
        if zero_stage(config) == 3 and not built_partitioned(self.model) and self.rank == 0:
            warnings.warn(
                "--deepspeed with ZeRO-3: the model was built whole on every rank (DeepSpeed partitions it only "
                "now); call gaudi_launch.runtime.zero_init.prepare_deepspeed(training_args) before building it "
                "(as scripts/run_clm.py does), so that each rank allocates only its partition",
                stacklevel=3,
            )
        # Without an "optimizer" block the Trainer's own optimizer is handed over, as HF does.
        optimizer = None if "optimizer" in config else make_optimizer(self.model, args, self.info, self.gaudi_config)
        self.engine, self.optimizer, _, ds_scheduler = deepspeed.initialize(
            model=self.model,
            model_parameters=[p for p in self.model.parameters() if p.requires_grad],
            optimizer=optimizer,
            config=config,
        )
        self._ds_scheduler = ds_scheduler  # a "scheduler" block: DeepSpeed's own, stepped by the engine
        self.train_model = self.engine

    def _planned_steps(self) -> int:
        """Optimizer steps this run will take (before any data is loaded)."""
        args = self.args
        if args.max_steps > 0:
            return args.max_steps
        n = len(self.train_dataset) if self.train_dataset is not None else 0
        batches = batches_per_rank(n, args.per_device_train_batch_size, self.world, args.dataloader_drop_last)
        return max(1, math.ceil(args.num_train_epochs * steps_per_epoch(batches, args.gradient_accumulation_steps)))

    def _torch_optimizer(self) -> torch.optim.Optimizer:
        """The torch optimizer the schedule drives (DeepSpeed's ZeRO wraps it)."""
        opt = self.optimizer
        while not isinstance(opt, torch.optim.Optimizer) and hasattr(opt, "optimizer"):
            opt = opt.optimizer
        return opt

    def train_dataloader(self) -> DataLoader:
        args = self.args
        # HF's order and sharding (sampling.py): shuffled with data_seed (else seed) + epoch, batches dealt
        # to the ranks in turn. One rank in HPU lazy mode: the last batch filled up (static shapes), as
        # optimum-habana pads its sampler; several ranks get full batches anyway.
        data_seed = getattr(args, "data_seed", None)
        sampler = DealtBatches(
            len(self.train_dataset),
            args.per_device_train_batch_size,
            self.world,
            self.rank,
            seed=args.seed if data_seed is None else data_seed,
            drop_last=args.dataloader_drop_last,
            pad_last=self.info.kind == "hpu" and self.info.lazy and not args.dataloader_drop_last,
        )
        # No generator of its own: starting an epoch's iterator draws one number (the workers' base seed) from
        # the global RNG, which dropout uses too, as transformers' loader does; so with dropout the same seed
        # gives its numbers. A resumed run restores the RNG after building its iterator (train()).
        return DataLoader(
            self.train_dataset,
            batch_sampler=sampler,
            collate_fn=self.collator,
            num_workers=args.dataloader_num_workers,
            multiprocessing_context=worker_start_method(self.info.kind, self.world, args.dataloader_num_workers),
            pin_memory=args.dataloader_pin_memory and self.info.kind == "cuda",
        )

    def _to_device(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        nb = self.args.non_blocking_data_copy
        batch = prepare_masks(batch, self.model, self.info)  # HPU: a padding mask the model need not read back
        moved = {k: v.to(self.info.device, non_blocking=nb) if torch.is_tensor(v) else v for k, v in batch.items()}
        mark_batch_dynamic(moved, self.info, self.args)  # --torch_compile: one graph for every batch size
        return moved

    def _grad_sync(self, last_micro: bool):
        """The context of a micro-batch's forward and backward: DDP all-reduces the gradients in every
        backward outside no_sync(), so every micro-batch but an optimizer step's last runs in it, as HF's
        Trainer (accelerate's accumulate) and optimum-habana's do: one all-reduce per step. fast_ddp and
        DeepSpeed reduce once per step by themselves."""
        if self._ddp is None or last_micro:
            return contextlib.nullcontext()
        return self._ddp.no_sync()

    # ---- training ------------------------------------------------------------------------------
    def _mean_across_ranks(self, value: torch.Tensor) -> float:
        """A loss kept on the device, averaged over ranks; the one host sync of a logging point.
        Reduced on the rank's device in float32: hccl serves hpu tensors only."""
        t = value.detach().float().reshape(1).clone()
        if self.world > 1:
            dist.all_reduce(t)
            t /= self.world
        return t.item()

    def train(self, resume_from_checkpoint: Optional[str] = None) -> TrainOutput:
        args = self.args
        loader = self.train_dataloader()
        accum = max(1, args.gradient_accumulation_steps)
        # Each epoch's batches in optimizer steps of `accum`, the last step taking what is left (sampling.py):
        # micro-batches never carry over into the next epoch's first step.
        windows = window_sizes(len(loader), accum)
        max_steps = args.max_steps if args.max_steps > 0 else math.ceil(args.num_train_epochs * len(windows))
        self._max_steps = max_steps
        log_every = absolute_steps(args.logging_steps, max_steps)  # a fraction below 1, as transformers 5
        self._log_every, self._batches_per_epoch = log_every, len(loader)
        if getattr(self, "_ds_scheduler", None) is not None:
            scheduler = _EngineScheduler(self.engine)
        else:
            scheduler = make_scheduler(self._torch_optimizer(), args, max_steps)
        self.scheduler = scheduler
        step, epoch, skip = 0, 0, 0
        resume = resume_from_checkpoint or args.resume_from_checkpoint
        if not resume and self.restart:
            resume = "latest"  # restarted by the launcher: go on from the newest complete checkpoint, if any
        state = self._resume(resume, scheduler) if resume else None
        rng = state.pop("rng", None) if state is not None else None  # restored once the iterator is built
        if state is not None:
            resume = state.pop("_path")
            step = int(state["step"])
            sampler_state = state["sampler_state"]
            if sampler_state is None:
                # A transformers checkpoint: the position follows from the step as transformers derives it
                # (Trainer._init_training_state: whole epochs, then the steps' batches of the next).
                sampler_state = {"epoch": step // len(windows), "batches": (step % len(windows)) * accum}
            epoch = int(sampler_state["epoch"])
            skip = int(sampler_state["batches"])
            if skip >= len(loader):  # saved at an epoch's last step: go on with the next epoch, as HF does
                epoch, skip = epoch + 1, 0
            self._say(f"resumed from {resume} at step {step} (epoch {epoch}, batch {skip})")
        if self.restart and self.rank == 0:  # a mark for the plots: the curve goes on from here
            self.writer.log(step, {"restart": self.restart})
        throughput = Throughput(warmup_steps=args.throughput_warmup_steps)
        self.inference_graphs.off()  # replayed graphs keep no autograd graph
        self._in_train = True
        n_train = len(self.train_dataset)
        # Losses stay on the device (no host sync per step, which would stall lazy mode's pipeline):
        # the sum over optimizer steps, and the sum since the last logged step (HF logs their mean).
        loss_sum: Optional[torch.Tensor] = None
        n_losses = 0
        since_log: Optional[torch.Tensor] = None
        n_since_log = 0
        self.train_model.train()
        done = step >= max_steps
        while not done:
            sampler = loader.batch_sampler
            sampler.set_epoch(epoch)
            sampler.skip = skip  # resuming: the same order, without loading the batches already trained on
            if rng is not None and skip == 0:  # resumed at an epoch's start: before the iterator draws
                ckpt.set_rng_state(rng)
                rng = None
            batches = enumerate(loader, start=skip)
            batch_index = skip - 1
            for size in windows_after(windows, skip):
                # The step's micro-batches are read first, as HF's Trainer.get_batch_samples does: the loss
                # is normalised by the scored tokens of the whole step (see loss_scales).
                window = [next(batches) for _ in range(size)]
                if rng is not None:
                    # Resumed inside an epoch: the RNG as it was at the save, once the iterator has drawn its
                    # seed and the first step's batches are read (Trainer._run_epoch's rng_to_sync).
                    ckpt.set_rng_state(rng)
                    rng = None
                scales = self._loss_scales([batch for _, batch in window])
                lr = scheduler.get_last_lr()[0]  # the rate this step uses (what HF logs)
                step_loss: Optional[torch.Tensor] = None
                for i, (batch_index, batch) in enumerate(window):
                    last_micro = i == len(window) - 1  # the micro-batch that ends the optimizer step
                    with self._grad_sync(last_micro):  # DDP: one gradient all-reduce per optimizer step
                        loss = self._micro_step(self._to_device(batch), len(window), scales[i], last_micro)
                    if args.logging_nan_inf_filter:
                        # As transformers (Trainer._run_epoch): a nan/inf micro-batch loss counts as the mean per
                        # step of what was summed since the last log; decided on the device, no sync.
                        so_far = sum(x for x in (since_log, step_loss) if x is not None) * torch.ones_like(loss)
                        loss = torch.where(torch.isfinite(loss), loss, so_far / (1 + n_since_log))
                    step_loss = loss if step_loss is None else step_loss + loss
                step += 1
                log_now = step % log_every == 0 or (args.logging_first_step and step == 1)
                grad_norm = self._optimizer_step(scheduler, want_norm=log_now)
                beat()  # --hang-timeout: this rank advanced
                # The samples this step trained on all ranks (an epoch's short last step counts what it had).
                trained = sum(
                    samples_in_round(
                        n_train, args.per_device_train_batch_size, self.world, i, args.dataloader_drop_last
                    )
                    for i, _ in window
                )
                throughput.step(trained, trained * (self.tokens_per_sample or 0))
                loss_sum = step_loss if loss_sum is None else loss_sum + step_loss
                n_losses += 1
                since_log = step_loss if since_log is None else since_log + step_loss
                n_since_log += 1
                # --adjust_throughput: logging and saving time are not training throughput either.
                paused = throughput.pause if args.adjust_throughput else contextlib.nullcontext
                if log_now:
                    with paused():
                        logged = self._mean_across_ranks(since_log) / n_since_log
                        self._log_step(step, logged, lr, throughput, grad_norm)
                    since_log, n_since_log = None, 0
                self._evaluate_if_due(step, False, throughput, last_step=step >= max_steps)
                if save_due(args, step, False, last_step=step >= max_steps):
                    with paused():
                        self._save(step, epoch, batch_index + 1)
                if self.on_step_end is not None:
                    self.on_step_end(step)
                if step >= max_steps:
                    done = True
                    break
            epoch_over = batch_index + 1 >= len(loader)  # also when it was the last step's
            if epoch_over or done:  # HF ends the epoch at a stop inside it too (Trainer._run_epoch: on_epoch_end)
                self._evaluate_if_due(step, True, throughput, epoch + 1)
            if (epoch_over or done) and save_due(args, step, True):
                with throughput.pause() if args.adjust_throughput else contextlib.nullcontext():
                    # At an epoch's end a resume starts the next epoch; at a stop inside one, goes on in it.
                    self._save(step, epoch + 1, 0) if epoch_over else self._save(step, epoch, batch_index + 1)
            skip = 0
            epoch += 1
        train_loss = self._mean_across_ranks(loss_sum / n_losses) if loss_sum is not None else 0.0
        metrics = {**throughput.metrics(), "train_loss": train_loss, "global_step": step}
        self._in_train = False
        if self.rank == 0:
            self.writer.log(step, metrics)
        return TrainOutput(step, metrics["train_loss"], metrics)

    def _resume(self, resume: Any, scheduler) -> Optional[dict]:
        """Load the checkpoint to resume from. "latest": the newest that loads, with a warning
        naming any newer one that does not (truncated, damaged); a path: that one or an error."""
        latest = resume == "latest" or resume is True
        candidates = ckpt.complete_checkpoints(self.args.output_dir) if latest else [resume]
        for i, path in enumerate(candidates):
            try:
                # Under DeepSpeed the engine reads every rank's partition back itself.
                engine = self.engine
                state = ckpt.load_checkpoint(
                    path,
                    model=self.model if engine is None else None,
                    optimizer=self.optimizer if engine is None else None,
                    scheduler=scheduler,
                    rank=self.rank,
                    engine=engine,
                    restore_rng=False,
                )
            except ckpt.CheckpointError as exc:
                if not latest or i + 1 == len(candidates):
                    raise
                if self.rank == 0:
                    warnings.warn(
                        f"{exc}; resuming from the previous checkpoint {candidates[i + 1]} instead", stacklevel=3
                    )
                continue
            return {**state, "_path": path}
        return None

    def _evaluate_if_due(
        self, step: int, epoch_end: bool, throughput: Throughput, epochs_done: int = 0, last_step: bool = False
    ) -> None:
        due = evaluation_due(self.args, step, epoch_end, epochs_done, last_step, self._max_steps)
        if self.eval_dataset is not None and due:
            with throughput.pause():  # evaluation time is not training throughput
                self.evaluate(step)

    def _token_total(self, counts: list[int]) -> torch.Tensor:
        """The scored tokens of a step (or an eval batch) over all ranks, on the device: one all-reduce,
        no host sync (HF gathers it: Trainer._get_num_items_in_batch, average_tokens_across_devices)."""
        total = torch.tensor(float(sum(counts)), device=self.info.device)
        if self.world > 1 and getattr(self.args, "average_tokens_across_devices", True):
            dist.all_reduce(total)
        return total

    def _loss_scales(self, window: list[dict[str, Any]]) -> list[Any]:
        """What each micro-batch's mean loss is multiplied by so that the step's loss is HF's: the
        summed token loss of the whole step on all ranks over its scored tokens (transformers 5's
        num_items_in_batch). A micro-batch's mean times its own scored tokens is its summed loss; times
        the world size because DDP (and fast_ddp, and DeepSpeed) average gradients over the ranks, as
        Trainer.compute_loss multiplies by num_processes. Batches without labels: the mean over the
        step's micro-batches (Trainer.training_step divides by current_gradient_accumulation_steps).
        Unlike HF's, this does not rely on the model to use num_items_in_batch: BertForMaskedLM and
        T5ForConditionalGeneration (transformers 5.24) take it among their **kwargs and ignore it, which
        leaves HF's Trainer with a loss gradient_accumulation_steps x world_size too large."""
        if self._shifts is None:
            self._shifts = loss_shifts_labels(self.model)
        counts = [scored_tokens(batch, self._shifts) for batch in window]
        if any(c is None for c in counts):
            return [1.0 / len(window)] * len(window)
        total = self._token_total(counts)
        across = self.world if self.world > 1 and getattr(self.args, "average_tokens_across_devices", True) else 1
        # A step without scored tokens anywhere has loss 0 (not 0/0).
        return [c * across / total.clamp(min=1.0) for c in counts]

    def _micro_step(
        self, batch: dict[str, torch.Tensor], accum: int, scale: Any = None, last: bool = True
    ) -> torch.Tensor:
        """Forward and backward of one micro-batch of an optimizer step of `accum` micro-batches; `scale`
        (from loss_scales) turns the model's mean loss into this micro-batch's share of the step's loss,
        `last`: the micro-batch that ends the step. Returns that share, on the device."""
        args, info = self.args, self.info
        with autocast(info, args, self.gaudi_config):
            out = self.train_model(**batch)
        raw = out["loss"] if isinstance(out, dict) else out.loss if hasattr(out, "loss") else out[0]
        if self.engine is not None:
            # Our loop sets the step boundaries (an epoch's short last step too), DeepSpeed follows, as
            # accelerate drives it for HF's Trainer (DeepSpeedEngineWrapper.backward): the boundary is
            # set before each backward (ZeRO-2/3 reduce gradients in it), the loss scaled by us and not
            # by the config's accumulation count (scale_wrt_gas=False, as HF), step() at the boundary.
            share = raw * scale if scale is not None else raw / accum
            self.engine.set_gradient_accumulation_boundary(last)
            self.engine.backward(share, scale_wrt_gas=False)
            mark_step(info)
            return share.detach().float()  # the step's loss is the sum of these shares
        loss = raw * scale if scale is not None else raw / accum
        if args.pipelining_fwd_bwd:
            mark_step(info)  # let the device run the forward graph while the host builds backward
        loss.backward()
        mark_step(info)
        return loss.detach().float()  # stays on the device

    def _optimizer_step(self, scheduler, want_norm: bool = False) -> Any:
        """Clip, step, zero. Returns the gradient norm before clipping (on the device; HF logs it as
        grad_norm), or None: without clipping it is computed only when `want_norm` (a logging step)."""
        args, info = self.args, self.info
        if self.engine is not None:
            self.engine.step()  # clips, steps the optimizer (and a config's scheduler), zeroes gradients
            scheduler.step()
            mark_step(info)
            # The norm the engine computed for its clip (accelerate's DeepSpeed path: get_global_grad_norm).
            return self.engine.get_global_grad_norm()
        if self.fast_ddp is not None:
            # No mark_step of its own (optimum-habana adds none): on HPU its copies are graph
            # replays, each flushing the pending ops first; the step's mark_step below ends the rest.
            self.fast_ddp.all_reduce_gradients()
        norm = None
        clip = args.max_grad_norm if args.max_grad_norm and args.max_grad_norm > 0 else None
        if clip is not None or want_norm:
            # No clip: an infinite bound measures the norm without scaling (as transformers' _get_grad_norm).
            bound = clip if clip is not None else float("inf")
            flat = self.fast_ddp.flat_gradients() if self.fast_ddp is not None else None
            if flat is not None:
                norm = clip_flat_grad_norm(flat, bound)  # every gradient is a view of it
            else:
                params = [p for p in self.model.parameters() if p.grad is not None]
                norm, self._fused_clip = clip_grad_norm(params, bound, info, self.gaudi_config, self._fused_clip)
        self.optimizer.step()
        scheduler.step()
        self.optimizer.zero_grad(set_to_none=grads_to_none(args, self.world))
        mark_step(info)
        return norm

    def _log_step(self, step: int, loss: float, lr: float, throughput: Throughput, grad_norm: Any = None) -> None:
        if self.rank != 0:
            return  # the main process logs (and only it queries the device's memory)
        # Unrounded, as HF's log_history keeps it (the console line rounds); lr: the rate the step used;
        # grad_norm: the logging step's gradient norm before clipping (the same on every rank), as HF logs it.
        values: dict[str, Any] = {"loss": loss}
        if grad_norm is not None:
            values["grad_norm"] = float(grad_norm)
        values["learning_rate"] = lr
        values.update(throughput.metrics())
        values.update(memory_stats(self.info))
        # the device goes to the file only: `gaudi-launch report` names CPU memory as the process's RSS
        self.writer.log(step, {**values, "device": self.info.kind})
        self._log_history.append(
            {"step": step, **{k: values[k] for k in ("loss", "grad_norm", "learning_rate") if k in values}}
        )
        self._say(format_log(step, values))

    def _save(self, step: int, epoch: int, batches: int) -> None:
        engine = self.engine  # under DeepSpeed every rank writes its own partition through it
        args = self.args
        # transformers' TrainerState fields, so that its Trainer resumes from this checkpoint too.
        eval_steps = absolute_steps(args.eval_steps, self._max_steps) if args.eval_steps else self._log_every
        trainer_state = {
            "epoch": epoch + batches / max(1, self._batches_per_epoch),
            "max_steps": self._max_steps,
            "logging_steps": self._log_every,
            "eval_steps": eval_steps,
            "save_steps": args.save_steps,
            "train_batch_size": args.per_device_train_batch_size,
            "num_train_epochs": math.ceil(args.num_train_epochs) if args.max_steps <= 0 else 0,
            "log_history": self._log_history,
        }
        with _deepspeed_unseen():
            ckpt.save_checkpoint(
                args.output_dir,
                step,
                model=self.model if engine is None else None,
                optimizer=self.optimizer if engine is None else None,
                scheduler=self.scheduler,
                engine=engine,
                sampler_state={"epoch": epoch, "batches": batches},
                total_limit=args.save_total_limit,
                rank=self.rank,
                world=self.world,
                trainer_state=trainer_state,
            )

    def _say(self, text: str) -> None:
        if self.rank == 0:
            self._log(text)

    def save_model(self, output_dir: Optional[str] = None) -> Optional[str]:
        """The trained model (not a resumable checkpoint) for from_pretrained: rank 0 writes it."""
        out = output_dir or self.args.output_dir
        engine = self.engine
        state: Optional[dict] = None
        if engine is not None and engine.zero_optimization_partition_weights():
            # ZeRO-3: each rank holds a partition, the module's own tensors are empty placeholders.
            if not engine.zero_gather_16bit_weights_on_model_save():
                return self._save_zero3_partitions(out)
            # A collective, one module at a time; rank 0 receives the whole state dict (as HF's Trainer).
            state = engine._zero3_consolidated_16bit_state_dict()
        if self.rank == 0:
            os.makedirs(out, exist_ok=True)
            state = ckpt.to_host(self.model.state_dict() if state is None else state)
            if hasattr(self.model, "save_pretrained"):
                with _deepspeed_unseen():
                    self.model.save_pretrained(out, state_dict=state)
            else:
                torch.save(state, os.path.join(out, "pytorch_model.bin"))
        if self.world > 1:
            dist.barrier()  # nobody reads the directory before it is complete
        return out

    def _save_zero3_partitions(self, out: str) -> str:
        """ZeRO-3 told not to gather the weights (stage3_gather_16bit_weights_on_model_save false): as
        HF's Trainer, the engine's checkpoint instead of a model file with empty tensors."""
        if self.rank == 0:
            warnings.warn(
                f"--deepspeed: stage3_gather_16bit_weights_on_model_save is false, so {out} gets DeepSpeed's "
                "partitioned checkpoint instead of model weights: recover them with the zero_to_fp32.py written "
                "there, or set it to true in the DeepSpeed config",
                stacklevel=3,
            )
            os.makedirs(out, exist_ok=True)
            if hasattr(self.model, "config") and hasattr(self.model.config, "save_pretrained"):
                self.model.config.save_pretrained(out)
        self.engine.save_checkpoint(out)  # every rank writes its partition
        return out

    # ---- evaluation ----------------------------------------------------------------------------
    def eval_dataloader(self) -> DataLoader:
        args = self.args
        # In order, batches dealt to the ranks in turn, a short last round completed from the start (as HF's
        # get_eval_dataloader through accelerate: sampling.py); evaluate() leaves the completion out.
        sampler = DealtBatches(
            len(self.eval_dataset),
            args.per_device_eval_batch_size,
            self.world,
            self.rank,
            seed=None,
            drop_last=args.dataloader_drop_last,
        )
        # No generator of its own: as transformers' evaluation loader, starting it draws one number from the
        # global RNG, so that training with dropout after an evaluation goes on with transformers' numbers.
        return DataLoader(
            self.eval_dataset,
            batch_sampler=sampler,
            collate_fn=self.collator,
            num_workers=args.dataloader_num_workers,  # as HF's get_eval_dataloader
            multiprocessing_context=worker_start_method(self.info.kind, self.world, args.dataloader_num_workers),
        )

    def evaluate(self, step: Optional[int] = None) -> dict[str, float]:
        """Mean loss and perplexity over eval_dataset on all ranks (logged at `step` if given)."""
        args, info = self.args, self.info
        note = multi_node_eval_warning(self.world, int(os.environ.get("LOCAL_WORLD_SIZE", self.world) or 1))
        if note and self.rank == 0 and not self._eval_warned:
            self._eval_warned = True  # once per run, however often it evaluates
            warnings.warn(note, stacklevel=2)
        loader = self.eval_dataloader()
        if not self._in_train:
            self.inference_graphs.on()  # outside training only: replays keep no autograd graph
        self.train_model.eval()
        total: Optional[torch.Tensor] = None
        count = 0
        counted: Optional[torch.Tensor] = None  # the samples with a finite loss (--logging_nan_inf_filter)
        sums: dict[str, torch.Tensor] = {}
        if self._shifts is None:
            self._shifts = loss_shifts_labels(self.model)
        with torch.no_grad():
            for index, batch in enumerate(loader):
                beat()  # a long evaluation is progress too (--hang-timeout)
                weight = eval_batch_weight(
                    index,
                    len(loader),
                    len(self.eval_dataset),
                    args.per_device_eval_batch_size,
                    self.world,
                    self.rank,
                    args.dataloader_drop_last,
                )
                scale = self._loss_scales([batch])[0] if self.world > 1 else 1.0
                batch = self._to_device(batch)
                with autocast(info, args, self.gaudi_config):
                    out = self.train_model(**batch)
                loss = (out["loss"] if isinstance(out, dict) else out.loss).detach().float()
                # A replayed HPU graph returns the same output tensors every batch, overwritten by the
                # next replay (bridge hpu/graphs.py, wrapped_hpugraph_forward): sums live in tensors of
                # our own, never an output itself, on the device (no sync per batch).
                # HF's eval loss: each rank's batch loss (token-normalised over the ranks' batches, as in
                # training) weighted by its samples, the completion of a short last round left out.
                share = loss * (scale * weight)
                if args.logging_nan_inf_filter:
                    # As transformers' evaluation_loop: nan/inf losses are left out of the mean (unless all are).
                    finite = torch.isfinite(loss)
                    share = torch.where(finite, share, torch.zeros_like(share))
                    kept = finite.float() * weight
                    counted = kept if counted is None else counted + kept
                total = share if total is None else total + share
                count += weight
                for name, (num, den) in (self.eval_metrics(out, batch) if self.eval_metrics else {}).items():
                    pair = torch.stack([num.detach().float(), den.detach().float()])
                    sums[name] = pair if name not in sums else sums[name] + pair
                # After the reads of this batch's outputs, so that lazy mode runs them before the next
                # replay overwrites the outputs (optimum-habana's evaluation_loop marks the step there too).
                mark_step(info)
        self.train_model.train()
        # Sum over ranks of the weighted losses over the samples weighed: one reduction of all, one sync.
        zero = torch.zeros((), device=info.device)
        kept = counted if counted is not None else torch.tensor(float(count), device=info.device)
        vec = torch.stack(
            [total if total is not None else zero, torch.tensor(float(count), device=info.device), kept.reshape(())]
        )
        if self.world > 1:
            dist.all_reduce(vec)
        loss_sum, weighed, finite = vec.tolist()
        if weighed and not finite:
            loss = float("nan")  # every loss was nan/inf: transformers' mean is nan too
        else:
            loss = loss_sum / finite if finite else 0.0
        metrics = {"eval_loss": loss, "perplexity": perplexity(loss)}
        for name in sorted(sums):
            pair = sums[name]
            if self.world > 1:
                dist.all_reduce(pair)
            num, den = pair.tolist()
            metrics[name] = num / den if den else float("nan")
        if self.rank == 0:
            self.writer.log(-1 if step is None else step, metrics)
            if step is not None:
                self._log_history.append({"step": step, **metrics})
            if step is not None:
                self._say(format_log(step, metrics))
        return metrics
