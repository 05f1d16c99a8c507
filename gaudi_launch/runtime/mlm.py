"""Masked-language-model data for BERT pre-training (scripts/run_mlm.py), as BERT masks tokens.

Of the positions chosen with ``mlm_probability`` 80% become the mask token, 10% a random token and
10% stay; labels are -100 everywhere else. Training batches are masked afresh each time (from the
global RNG the Trainer seeds and checkpoints); the evaluation set is masked once, with a fixed
seed, so evaluations before and after training score the same positions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Optional

import torch

MASK_TOKEN = "<|mask|>"
IGNORE = -100


def add_mask_token(tokenizer) -> int:
    """The tokenizer's mask token id (added when it has none)."""
    if tokenizer.mask_token is None:
        tokenizer.add_special_tokens({"mask_token": MASK_TOKEN})
    return tokenizer.mask_token_id


def mask_tokens(
    input_ids: torch.Tensor,
    mask_id: int,
    vocab_size: int,
    probability: float,
    special_ids: Sequence[int] = (),
    generator: Optional[torch.Generator] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(masked inputs, labels) for a batch of token ids."""
    labels = input_ids.clone()
    chance = torch.full(labels.shape, probability)
    for special in special_ids:
        chance.masked_fill_(input_ids == special, 0.0)
    chosen = torch.bernoulli(chance, generator=generator).bool()
    labels[~chosen] = IGNORE
    inputs = input_ids.clone()
    to_mask = torch.bernoulli(torch.full(labels.shape, 0.8), generator=generator).bool() & chosen
    inputs[to_mask] = mask_id
    to_random = torch.bernoulli(torch.full(labels.shape, 0.5), generator=generator).bool() & chosen & ~to_mask
    inputs[to_random] = torch.randint(vocab_size, labels.shape, generator=generator)[to_random]
    return inputs, labels


class MLMCollator:
    """Stacks equal-length blocks and masks them; blocks already masked (the evaluation set from
    ``premask``, whose labels hold -100) are stacked as they are."""

    def __init__(self, mask_id: int, vocab_size: int, probability: float = 0.15, special_ids: Sequence[int] = ()):
        self.mask_id, self.vocab_size, self.probability = mask_id, vocab_size, probability
        self.special_ids = tuple(special_ids)

    def __call__(self, features: Sequence[Mapping[str, Any]]) -> dict[str, torch.Tensor]:
        ids = torch.stack([torch.as_tensor(f["input_ids"], dtype=torch.long) for f in features])
        if "labels" in features[0] and any(bool((torch.as_tensor(f["labels"]) == IGNORE).any()) for f in features):
            labels = torch.stack([torch.as_tensor(f["labels"], dtype=torch.long) for f in features])  # pre-masked
        else:
            ids, labels = mask_tokens(ids, self.mask_id, self.vocab_size, self.probability, self.special_ids)
        # No attention_mask: blocks are never padded (an all-ones mask costs a host read per forward on HPU).
        return {"input_ids": ids, "labels": labels}


def premask(
    blocks, mask_id: int, vocab_size: int, probability: float, special_ids: Sequence[int] = (), seed: int = 1234
):
    """Blocks masked once with a fixed seed: an evaluation set that scores the same positions every time."""
    generator = torch.Generator().manual_seed(seed)
    out = []
    for block in blocks:
        ids = torch.as_tensor(block["input_ids"], dtype=torch.long)[None]
        inputs, labels = mask_tokens(ids, mask_id, vocab_size, probability, special_ids, generator)
        out.append({"input_ids": inputs[0].tolist(), "labels": labels[0].tolist()})
    return out


def masked_accuracy(output, batch: Mapping[str, torch.Tensor]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Trainer eval metric: correct predictions at the masked positions, on the device."""
    logits = output["logits"] if isinstance(output, dict) else output.logits
    labels = batch["labels"]
    scored = labels != IGNORE
    correct = (logits.argmax(-1) == labels) & scored
    return {"accuracy": (correct.sum(), scored.sum())}
