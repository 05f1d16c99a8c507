"""Stand-in for habana_frameworks.torch.hpex.kernels.FusedSDPA, computed with torch's SDPA.

As python_packages/habana_frameworks/torch/hpex/kernels/FusedSDPA.py (bridge 1.19):
``FusedSDPA.apply(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
softmax_mode="None", recompute_mode=None, valid_seq_len=None, seq_padding_type="left",
return_dropout_mask=False, return_attn_probs=False)``; ``recompute_mode=None`` means the
PT_HPU_SDPA recompute default; the kernel asserts the fast softmax in recompute training only
with a causal mask, ``valid_seq_len`` only in causal inference without a mask; and it takes
grouped-query K/V (fewer heads than Q) itself, so callers need not repeat them. Inputs must be
on the device.

The arithmetic is the bridge's own reference for the kernel (tests/pytest_working/any_mode/FusedSDPA/
test_hpu_sdpa.py, ``vanilla_attention_impl_for_test``): a boolean ``attn_mask`` keeps the True
positions and sets the others to -inf (a row with none kept gives NaN), a float one is added to the
scores, and ``is_causal`` without a mask masks the future with -1e9. The bridge tests boolean masks
in inference only (``tc_list_rhslice_inf_attn_mask``; its training case with a boolean mask sits in
``tc_list_new_rules``, which its test list leaves out); optimum-habana passes additive float masks.
"""

from __future__ import annotations

import hpu_stand_in_device as _bridge
import torch
from habana_frameworks import record


def _is_gqa(q, k) -> bool:
    return q.dim() == 4 and q.shape[1] != k.shape[1] and k.shape[1] != 1


class FusedSDPA:
    @staticmethod
    def apply(
        q,
        k,
        v,
        attn_mask=None,
        dropout_p=0.0,
        is_causal=False,
        scale=None,
        softmax_mode="None",
        recompute_mode=None,
        valid_seq_len=None,
        seq_padding_type="left",
        return_dropout_mask=False,
        return_attn_probs=False,
    ):
        tensors = [t for t in (q, k, v, attn_mask) if t is not None]
        if not all(_bridge.is_hpu_tensor(t) for t in tensors):
            raise RuntimeError("FusedSDPA: all inputs must be hpu tensors")
        requires_backward = q.requires_grad or k.requires_grad or v.requires_grad
        given_softmax_mode, softmax_mode = softmax_mode, softmax_mode.lower()
        recompute = recompute_mode if recompute_mode is not None else False
        if return_attn_probs:
            assert requires_backward is False, "return_attn_probs is supported only for inference mode"
            recompute = False
        if recompute and requires_backward and softmax_mode == "fast":
            assert is_causal is True, (
                "Optimized softmax mode is supported in recompute training mode only in causal(triangular) mask case"
            )
        if valid_seq_len is not None:
            assert is_causal and not requires_backward and attn_mask is None, (
                "Valid sequence length is supported only in inference with is_causal(triangular) mask case"
            )
        gqa = _is_gqa(q, k)
        record(
            "FusedSDPA.apply",
            shape=tuple(q.shape),
            kv_shape=tuple(k.shape),
            gqa=gqa,
            mask=None if attn_mask is None else str(attn_mask.dtype),
            dropout_p=dropout_p,
            is_causal=is_causal,
            scale=scale,
            softmax_mode=given_softmax_mode,
            recompute_mode=recompute_mode,
        )
        if gqa:
            assert q.shape[1] % k.shape[1] == 0, "query heads must be a multiple of key/value heads"
            rep = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        return _reference(q, k, v, attn_mask, dropout_p, is_causal, scale)


def _reference(q, k, v, attn_mask, dropout_p, is_causal, scale):
    scores = (q @ k.transpose(-2, -1)) * (scale if scale is not None else q.shape[-1] ** -0.5)
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attn_mask, float("-inf"))
        else:
            scores = scores + attn_mask
    elif is_causal:
        keep = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~keep, -1e9)
    weights = torch.softmax(scores, dim=-1)
    if dropout_p > 0:
        weights = torch.nn.functional.dropout(weights, dropout_p)
    return weights.to(v.dtype) @ v
