"""Which samples each rank trains on, in which order, and how batches group into optimizer steps: the
order transformers' Trainer gives (5.24, through accelerate 1.15), so a run gives its numbers.

transformers' ``Trainer._get_train_sampler`` takes a ``RandomSampler``; ``accelerate``'s
``prepare_data_loader`` swaps it for a ``SeedableRandomSampler`` (``use_seedable_sampler``, on by default)
seeded with ``data_seed`` or else the seed ``set_seed`` gave torch (``TrainingArguments.seed``) plus the epoch,
groups it into batches of the per-device size over the whole data set, and deals those batches out to the
ranks in turn (``BatchSamplerShard``, ``even_batches``): rank r takes global batches r, r + W, ...; a short
last round is completed with samples from the start of the epoch's order, so every rank gets as many full
batches as the others. Evaluation deals the samples in their own order the same way.
``Trainer._run_epoch`` then cuts an epoch's batches into optimizer steps of ``gradient_accumulation_steps``
batches, the last step of the epoch taking what is left (never carried into the next epoch).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Optional

import torch
from torch.utils.data import RandomSampler, Sampler


def epoch_order(n: int, seed: int, epoch: int) -> list[int]:
    """The sample indices of one epoch, shuffled as accelerate's SeedableRandomSampler.__iter__ does
    (data_loader.py: a generator seeded with seed + epoch, driving torch's RandomSampler). Pure."""
    generator = torch.Generator()
    generator.manual_seed(seed + epoch)
    return list(RandomSampler(range(n), generator=generator))


def deal_batches(
    order: list[int], batch_size: int, world: int, rank: int, drop_last: bool = False, pad_last: bool = False
) -> list[list[int]]:
    """This rank's batches of ``order``: accelerate's BatchSamplerShard._iter_with_no_split with
    even_batches (data_loader.py). Global batches of ``batch_size`` go to ranks in turn; with drop_last
    an incomplete round is dropped, else it is completed from the start of ``order``, cycling if need be.
    One rank: the last batch stays short, unless ``pad_last`` (HPU lazy mode's static shapes, as
    optimum-habana pads its sampler) fills it from the start too. Pure."""
    if batch_size < 1 or world < 1 or not 0 <= rank < world:
        raise ValueError(f"deal_batches: batch_size {batch_size}, world {world}, rank {rank}")
    batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    if drop_last and batches and len(batches[-1]) < batch_size:
        batches.pop()
    if world == 1:
        if pad_last and batches and len(batches[-1]) < batch_size:
            batches[-1] = _fill(batches[-1], order, batch_size)
        return batches
    full = len(batches) - (1 if batches and len(batches[-1]) < batch_size else 0)
    full_rounds = full // world
    if full_rounds * world == len(batches):
        return batches[rank::world]
    if drop_last:
        return batches[rank : full_rounds * world : world]
    # Complete the last round: the short batch (if any) and the missing ones, from the start of the order.
    done = batches[: full_rounds * world]
    rest = batches[full_rounds * world :]
    filler = _cycle(order, batch_size * world)
    completed, used = [], 0
    for i in range(world):
        have = rest[i] if i < len(rest) else []
        need = batch_size - len(have)
        completed.append(have + filler[used : used + need])
        used += need
    return (done + completed)[rank::world]


def _cycle(order: list[int], length: int) -> list[int]:
    out = list(order)
    while out and len(out) < length:
        out += order
    return out


def _fill(batch: list[int], order: list[int], batch_size: int) -> list[int]:
    return batch + _cycle(order, batch_size)[: batch_size - len(batch)]


def batches_per_rank(n: int, batch_size: int, world: int, drop_last: bool = False) -> int:
    """How many batches each rank gets in an epoch of n samples (len(BatchSamplerShard)). Pure."""
    total = n // batch_size if drop_last else math.ceil(n / batch_size)
    return total // world if drop_last else math.ceil(total / world)


def samples_in_round(n: int, batch_size: int, world: int, index: int, drop_last: bool = False) -> int:
    """The dataset's samples that the ranks' batch ``index`` of an epoch holds together: a whole round but the
    last, which holds what is left; the completion from the epoch's start (several ranks) and a padded last
    batch (HPU lazy mode) repeat samples and count for nothing, as transformers counts an epoch as the
    dataset's length (Trainer.num_examples). What the throughput counts. Pure."""
    if drop_last:
        return batch_size * world
    return max(0, min(batch_size * world, n - index * batch_size * world))


def window_sizes(batches: int, accum: int) -> list[int]:
    """The micro-batches of each optimizer step in an epoch of ``batches`` batches: ``accum`` each, the
    last step what is left (transformers' Trainer._run_epoch, ``remainder``). Pure."""
    accum = max(1, accum)
    sizes = [accum] * (batches // accum)
    if batches % accum:
        sizes.append(batches % accum)
    return sizes


def steps_per_epoch(batches: int, accum: int) -> int:
    """Optimizer steps in an epoch (Trainer.set_initial_training_values: ceil, at least 1). Pure."""
    return max(1, math.ceil(batches / max(1, accum)))


class DealtBatches(Sampler):
    """A batch sampler over this rank's batches of each epoch (``epoch_order`` or the data set's own order,
    dealt by ``deal_batches``). ``set_epoch`` picks the epoch; ``skip`` batches are left out of the next
    iteration (a resumed run goes on where its checkpoint was, without loading what it skips)."""

    def __init__(
        self,
        n: int,
        batch_size: int,
        world: int = 1,
        rank: int = 0,
        seed: Optional[int] = 0,
        drop_last: bool = False,
        pad_last: bool = False,
    ):
        self.n, self.batch_size, self.world, self.rank = n, batch_size, world, rank
        self.seed, self.drop_last, self.pad_last = seed, drop_last, pad_last
        self.epoch, self.skip = 0, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def batches(self) -> list[list[int]]:
        order = list(range(self.n)) if self.seed is None else epoch_order(self.n, self.seed, self.epoch)
        return deal_batches(order, self.batch_size, self.world, self.rank, self.drop_last, self.pad_last)

    def __iter__(self) -> Iterator[list[int]]:
        yield from self.batches()[self.skip :]

    def __len__(self) -> int:
        """Batches in a whole epoch (skipped ones included: the loop counts batch indices from 0)."""
        return batches_per_rank(self.n, self.batch_size, self.world, self.drop_last)


def windows_after(sizes: list[int], skip: int) -> list[int]:
    """The steps of an epoch still to run once ``skip`` batches were trained on (a resume). A checkpoint
    is written at a step's end, so ``skip`` falls between steps; one that does not (an older checkpoint)
    finishes its step with the batches left in it. Pure."""
    out, start = [], 0
    for size in sizes:
        end = start + size
        if end > skip:
            out.append(end - max(start, skip))
        start = end
    return out
