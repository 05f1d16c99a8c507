"""Stand-in for habana_frameworks.torch.hpex.kernels: FusedSDPA computed with torch's SDPA."""
from __future__ import annotations

import torch

from habana_frameworks import record


class FusedSDPA:
    """Positional arguments as the Gaudi kernel takes them; the result is torch's SDPA."""

    @staticmethod
    def apply(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
              softmax_mode="None", recompute_mode=False, *rest):
        record("FusedSDPA.apply", shape=tuple(query.shape), kv_shape=tuple(key.shape),
               mask=None if attn_mask is None else str(attn_mask.dtype), dropout_p=dropout_p,
               is_causal=is_causal, scale=scale, softmax_mode=softmax_mode, recompute_mode=recompute_mode)
        return torch.nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale)
