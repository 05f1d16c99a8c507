"""How the Trainer's DataLoader workers start (issue 23, item 9).

optimum-habana 1.21.2 starts loader workers with "spawn" instead of fork beyond 8 ranks (its
accelerator's prepare_data_loader, against Habana's SW-207456); so does the Trainer, on HPU. A spawned
worker gets the dataset and collate function by pickling, so the shipped ones must pickle: checked
here with real spawned workers on the CPU.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.utils.data import DataLoader

from gaudi_launch.runtime.args import TrainingArguments
from gaudi_launch.runtime.data import BlockDataset, causal_lm_collator
from gaudi_launch.runtime.mlm import MLMCollator
from gaudi_launch.runtime.summarization import ListDataset, Seq2SeqCollator
from gaudi_launch.runtime.trainer import Trainer, worker_start_method


@pytest.mark.parametrize(
    "kind, world, workers, expected",
    [
        ("hpu", 16, 2, "spawn"),
        ("hpu", 9, 1, "spawn"),
        ("hpu", 8, 2, None),  # up to 8 ranks (one Gaudi node) workers fork, as optimum-habana's
        ("hpu", 16, 0, None),  # no workers: nothing to start
        ("cpu", 16, 2, None),  # no bridge in the parent: fork is safe
        ("cuda", 16, 2, None),
    ],
)
def test_workers_spawn_on_hpu_beyond_eight_ranks(kind, world, workers, expected):
    assert worker_start_method(kind, world, workers) == expected


def _blocks(n: int = 12, width: int = 6) -> list[dict[str, list[int]]]:
    return [{"input_ids": [(i * 7 + j) % 50 for j in range(width)]} for i in range(n)]


def _batches(loader: DataLoader) -> list[dict[str, torch.Tensor]]:
    return [dict(batch) for batch in loader]


def _same(a: list[dict[str, torch.Tensor]], b: list[dict[str, torch.Tensor]]) -> bool:
    return len(a) == len(b) and all(
        x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x) for x, y in zip(a, b)
    )


class _Reg(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(50, 4)

    def forward(self, input_ids, labels, attention_mask=None):
        return {"loss": self.emb(input_ids).float().pow(2).mean()}


def test_the_trainers_loaders_spawn_their_workers_beyond_eight_hpu_ranks_and_run(tmp_path):
    data = BlockDataset(_blocks(64))
    args = TrainingArguments(
        output_dir=str(tmp_path),
        device="cpu",
        per_device_train_batch_size=2,
        per_device_eval_batch_size=2,
        dataloader_num_workers=1,
        report_to="none",
    )
    trainer = Trainer(_Reg(), args, train_dataset=data, eval_dataset=data, data_collator=causal_lm_collator)
    assert trainer.train_dataloader().multiprocessing_context is None  # one CPU rank: the default (fork)
    # The decision's inputs as a 16-rank Gaudi job has them (the loaders read nothing else of the device).
    trainer.info, trainer.world = dataclasses.replace(trainer.info, kind="hpu"), 16
    train, evals = trainer.train_dataloader(), trainer.eval_dataloader()
    for loader in (train, evals):
        assert loader.multiprocessing_context.get_start_method() == "spawn"
    # Real spawned workers: the dataset and collator reach them pickled, the batches are the in-process ones.
    train.batch_sampler.set_epoch(0)
    reference = DataLoader(data, batch_sampler=train.batch_sampler, collate_fn=causal_lm_collator)
    assert _same(_batches(train), _batches(reference)) and len(reference) == 2


def test_the_shipped_collators_and_datasets_run_in_spawned_workers():
    """run_clm's, run_summarization's and run_mlm's dataset and collator, each through one spawned worker."""
    pairs = [{"input_ids": list(range(1, 3 + i % 4)), "labels": list(range(5, 6 + i % 3))} for i in range(8)]
    for dataset, collate in ((BlockDataset(_blocks(8)), causal_lm_collator), (ListDataset(pairs), Seq2SeqCollator(0))):
        spawned = DataLoader(dataset, batch_size=4, collate_fn=collate, num_workers=1, multiprocessing_context="spawn")
        local = DataLoader(dataset, batch_size=4, collate_fn=collate)
        assert _same(_batches(spawned), _batches(local)), type(collate).__name__
    # The MLM collator masks at random, in the worker: labels keep the chosen positions' ids, inputs the rest.
    blocks = BlockDataset(_blocks(8))
    collate = MLMCollator(mask_id=49, vocab_size=50, probability=0.5)
    loader = DataLoader(blocks, batch_size=8, collate_fn=collate, num_workers=1, multiprocessing_context="spawn")
    (batch,) = _batches(loader)
    chosen = batch["labels"] != -100
    assert bool(chosen.any()) and bool((~chosen).any())
    assert torch.equal(batch["labels"][chosen], blocks.input_ids[chosen])
    assert torch.equal(batch["input_ids"][~chosen], blocks.input_ids[~chosen])
