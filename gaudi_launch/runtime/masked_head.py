"""BERT's masked-LM head on the masked positions only (``--mlm_head_masked_only``, on by default off HPU).

transformers' ``BertForMaskedLM`` runs its prediction head (a dense layer, GELU, LayerNorm and the
hidden x vocabulary decoder) and the log-softmax over every position, then the loss ignores all but
the ~15% that were masked (labels -100 elsewhere). BERT's own pre-training gathers the masked
positions first and runs the head there only (google-research/bert ``run_pretraining.py``,
``gather_indexes``; NVIDIA's and Habana's BERT references do the same). The loss and every gradient
are the same up to rounding: the skipped positions contribute nothing to either. On this project's
CPU it halves a tiny BERT's training step (52 against 27 ms at batch 32 x 64 tokens).

Only in training with labels: in evaluation, or without labels, the model's own forward runs, so
the output's logits keep their (batch, sequence, vocabulary) shape there. In training the output's
logits are those of the masked positions only, (masked tokens, vocabulary), in row-major order.

Not on HPU: the number of masked positions changes every batch, and a lazy-mode graph is compiled
per shape (Habana's reference pads to a fixed number of predictions instead). Not with CUDA graphs
either (``--use_hpu_graphs_for_training`` on CUDA), which record one graph per shape.
"""

from __future__ import annotations

import types
from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F

from .device import DeviceInfo

IGNORE = -100  # transformers' label for "not scored"


def applies(device_kind: str, enabled: bool, graphs: bool) -> bool:
    """Whether to run the head on masked positions only: off HPU, without CUDA graphs. Pure."""
    return enabled and device_kind != "hpu" and not (device_kind == "cuda" and graphs)


def _bert_masked_only(self, *args, **kwargs):
    """BertForMaskedLM.forward, with the head and the loss on the positions labels score. Called
    with keywords (as the Trainer calls it); positional arguments get the model's own forward."""
    labels = kwargs.get("labels")
    if args or not self.training or labels is None:
        return type(self).forward(self, *args, **kwargs)
    from transformers.modeling_outputs import MaskedLMOutput

    inputs = {k: v for k, v in kwargs.items() if k not in ("labels", "return_dict")}
    outputs = self.bert(return_dict=True, **inputs)
    # One data-dependent shape (a single graph break under torch.compile): the scored positions.
    positions = (labels.reshape(-1) != IGNORE).nonzero().squeeze(1)
    hidden = outputs[0]
    logits = self.cls(hidden.reshape(-1, hidden.shape[-1]).index_select(0, positions))  # (masked, vocabulary)
    loss = F.cross_entropy(logits, labels.reshape(-1).index_select(0, positions))
    return MaskedLMOutput(loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions)


def _forwards() -> dict[type, Callable]:
    """{model class: its masked-only forward} known here; none without transformers."""
    try:
        from transformers import BertForMaskedLM
    except ImportError:
        return {}
    return {BertForMaskedLM: _bert_masked_only}


def use_masked_only_head(model: torch.nn.Module, info: DeviceInfo, enabled: bool = True, graphs: bool = False) -> bool:
    """Give ``model`` (in place) the masked-only forward if its exact class has one; whether it did.
    An instance attribute: the class, its config and what ``save_pretrained`` writes are unchanged."""
    forward: Optional[Callable[..., Any]] = _forwards().get(type(model))
    if forward is None or not applies(info.kind, enabled, graphs):
        return False
    model.forward = types.MethodType(forward, model)
    return True
