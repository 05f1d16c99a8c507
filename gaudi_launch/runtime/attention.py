"""Flash attention: Gaudi's FusedSDPA for models whose attention goes through transformers' interface.

``--attn_implementation gaudi_fused_sdpa`` (optimum-habana's name) registers a transformers attention
function that calls ``habana_frameworks.torch.hpex.kernels.FusedSDPA`` on HPU. Off HPU the same
request becomes torch's SDPA ("sdpa"), which picks flash kernels on CUDA by itself. Models whose
attention does not dispatch through ``AttentionInterface`` keep their own, with a warning.
"""

from __future__ import annotations

import dataclasses
import importlib
import warnings
from typing import Any, Optional

import torch

from .device import DeviceInfo

FUSED_SDPA = "gaudi_fused_sdpa"


@dataclasses.dataclass(frozen=True)
class FusedSDPAOptions:
    recompute: bool = False  # recompute the attention in backward rather than keep it (memory)
    causal_mask: bool = False  # the kernel makes the causal mask: a padding mask is not passed
    fast_softmax: bool = False  # the kernel's reduced-precision softmax


def resolve_attn_implementation(requested: Optional[str], device_kind: str) -> Optional[str]:
    """The attention name to give the model on this device (None: leave the model's own). Pure."""
    if requested == FUSED_SDPA and device_kind != "hpu":
        return "sdpa"
    return requested


def additive_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean attention mask (True: attend) as the additive float mask optimum-habana gives
    FusedSDPA (its _gaudi_prepare_4d_causal_attention_mask: 0 where attended, the dtype's lowest
    value elsewhere). The bridge checks boolean masks against its reference in inference only; a row
    with nothing attended gives finite weights here, not the NaN of a -inf fill. Pure."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)


def fused_sdpa_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Optional[torch.Tensor],
    dropout: float = 0.0,
    scaling: Optional[float] = None,
    is_causal: Optional[bool] = None,
    options: FusedSDPAOptions = FusedSDPAOptions(),
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract: q/k/v are (batch, heads, seq, dim); the output is
    (batch, seq, heads, dim) and no attention weights (the kernel never materialises them)."""
    if kwargs.get("position_bias") is not None or kwargs.get("softcap") is not None:
        raise ValueError(
            f"{type(module).__name__}: {FUSED_SDPA} supports neither position biases nor "
            "soft-capping; use --attn_implementation eager for this model"
        )
    kernels = importlib.import_module("habana_frameworks.torch.hpex.kernels")
    # Grouped-query K/V (fewer heads than Q) go in as they are: the kernel handles them itself.
    q_len = query.shape[2]
    causal_layer = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    if options.causal_mask and causal_layer and q_len > 1:
        # The kernel's own causal mask is cheaper than reading a (B, 1, S, S) one from memory.
        attention_mask, causal = None, True
    else:
        # transformers leaves the mask out exactly when the pattern is plain causal.
        causal = bool(causal_layer and attention_mask is None and q_len > 1)
    if attention_mask is not None and attention_mask.dtype == torch.bool:  # sdpa_mask builds boolean ones
        attention_mask = additive_mask(attention_mask, query.dtype)
    out = kernels.FusedSDPA.apply(
        query,
        key,
        value,
        attention_mask,
        dropout,
        causal,
        scaling,
        "fast" if options.fast_softmax else "None",
        options.recompute,
    )
    return out.transpose(1, 2).contiguous(), None


def register_fused_sdpa(options: FusedSDPAOptions) -> None:
    """Make ``gaudi_fused_sdpa`` a transformers attention implementation (masks built as for sdpa)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    def forward(*args: Any, **kwargs: Any) -> tuple[torch.Tensor, None]:
        return fused_sdpa_forward(*args, options=options, **kwargs)

    AttentionInterface.register(FUSED_SDPA, forward)
    AttentionMaskInterface.register(FUSED_SDPA, sdpa_mask)


def apply_attention(model: torch.nn.Module, args: Any, info: DeviceInfo) -> Optional[str]:
    """Switch the model to args.attn_implementation on this device; return what it now uses."""
    requested = getattr(args, "attn_implementation", None)
    name = resolve_attn_implementation(requested, info.kind)
    if name is None:
        return None
    if name != requested:
        warnings.warn(
            f"--attn_implementation {requested} is Gaudi's kernel; on {info.kind} the model uses "
            f"torch's scaled_dot_product_attention ({name}) instead",
            stacklevel=2,
        )
    if name == FUSED_SDPA:
        register_fused_sdpa(
            FusedSDPAOptions(
                recompute=args.flash_attention_recompute,
                causal_mask=args.flash_attention_causal_mask,
                fast_softmax=args.flash_attention_fast_softmax,
            )
        )
    setter = getattr(model, "set_attn_implementation", None)
    if setter is None:
        warnings.warn(
            f"{type(model).__name__} is not a transformers model: --attn_implementation {requested} "
            "does not apply to it",
            stacklevel=2,
        )
        return None
    try:
        setter(name)
    except (ValueError, ImportError) as exc:
        warnings.warn(
            f"{type(model).__name__} cannot use attn_implementation={name!r} ({exc}); "
            f"it keeps {model.config._attn_implementation!r}",
            stacklevel=2,
        )
        return model.config._attn_implementation
    return name
