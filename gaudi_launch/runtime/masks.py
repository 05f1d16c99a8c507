"""Attention masks that cost no device-to-host sync on HPU.

transformers reads a padding mask's values on the host to decide whether it can drop it (masking_utils:
``_ignore_causal_mask_sdpa`` and ``_ignore_bidirectional_mask_sdpa`` branch on ``mask.all()``), and
reads the input ids when there is none (``warn_if_padding_and_no_attention_mask``). On a Gaudi in lazy
mode each read is a step marker and a device-to-host copy (the bridge's lazy kernels,
``_local_scalar_dense_hpu``); inside an HPU graph the branch taken at capture is replayed whatever later
batches hold. So: the collators send no mask where nothing is padded, and the Trainer leaves out any
collator's mask that masks nothing; an encoder-decoder's padding mask goes in already expanded (4D,
additive, built on the host), which transformers takes as it is; and the no-mask padding check runs
once, the only time its warning can show.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Optional

import torch

from .device import DeviceInfo


def mask_if_padded(mask: torch.Tensor) -> Optional[torch.Tensor]:
    """A host-side padding mask, or None where it masks nothing (the same attention). Pure."""
    return None if bool(mask.all()) else mask


def expanded_encoder_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A (batch, length) padding mask as the (batch, 1, 1, length) additive mask transformers makes of
    it for an encoder and for cross-attention: 0 where attended, the dtype's lowest value elsewhere.
    Pure (on whatever device the mask is)."""
    keep = mask[:, None, None, :].bool()
    return torch.zeros(keep.shape, dtype=dtype, device=mask.device).masked_fill(~keep, torch.finfo(dtype).min)


def prepare_masks(batch: dict[str, Any], model: torch.nn.Module, info: DeviceInfo) -> dict[str, Any]:
    """On HPU, a 2D padding mask still on the host is settled there, so that the model never reads it
    back: one that masks nothing is left out (any collator's, e.g. transformers' default one, which
    always sends it) where the model's forward does without it; an encoder-decoder's is expanded.
    The attention_mask of an encoder-decoder is the encoder's padding mask, used bidirectionally
    (encoder and cross-attention), so it has no causal part. Anything else as it is."""
    mask = batch.get("attention_mask")
    if info.kind != "hpu" or not torch.is_tensor(mask) or mask.dim() != 2 or mask.device.type != "cpu":
        return batch
    if mask_if_padded(mask) is None and _mask_optional(type(model)):
        return {k: v for k, v in batch.items() if k != "attention_mask"}
    if not getattr(getattr(model, "config", None), "is_encoder_decoder", False):
        return batch
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    return {**batch, "attention_mask": expanded_encoder_mask(mask, dtype)}


@functools.cache
def _mask_optional(cls: type) -> bool:
    """Whether the model class's forward (not the instance's, which HPU graphs replace) has an
    attention_mask with a default (transformers' models: None)."""
    forward = getattr(cls, "forward", None)
    try:
        params = inspect.signature(forward).parameters
    except (TypeError, ValueError):
        return False
    if "attention_mask" in params:
        return params["attention_mask"].default is not inspect.Parameter.empty
    return False


def check_padding_once(model: torch.nn.Module, info: DeviceInfo) -> int:
    """On HPU, transformers' check for padded input ids without a mask runs on the first forward only:
    it reads the ids on the host in every forward (a sync per step in lazy mode) to show a warning
    that shows once anyway (``logger.warning_once``). Returns how many modules were changed."""
    if info.kind != "hpu":
        return 0
    changed = 0
    for module in model.modules():
        check = getattr(module, "warn_if_padding_and_no_attention_mask", None)
        if check is None or "warn_if_padding_and_no_attention_mask" in vars(module):
            continue
        module.warn_if_padding_and_no_attention_mask = _once(check)
        changed += 1
    return changed


def _once(check):
    done: list = []

    def first_only(input_ids, attention_mask):
        if not done:
            done.append(True)
            check(input_ids, attention_mask)

    return first_only
