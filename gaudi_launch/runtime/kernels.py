"""Fused equivalents of a model's slow modules, swapped in off HPU (``--fused_kernels``, on by default).

transformers' ``NewGELUActivation`` (GPT-2's ``gelu_new``) computes the tanh approximation of GELU as
eight separate element-wise ops, each with its own pass over memory and its own backward node;
``GELUTanh`` (transformers' ``gelu_pytorch_tanh``) is the same function as one torch kernel,
``F.gelu(approximate="tanh")``, equal to it up to rounding (2e-7 here). On this project's CPU
that is 8% of a tiny GPT-2's training step. Activations hold no weights: the model's state dict
and config (and so what ``save_pretrained`` writes) are unchanged. HPU keeps the model as it is:
its graph compiler fuses element-wise ops itself.
"""

from __future__ import annotations

import torch

from .device import DeviceInfo


def _swaps() -> dict:
    """{slow class: factory of its fused equivalent} known here; none without transformers."""
    try:
        from transformers.activations import GELUTanh, NewGELUActivation
    except ImportError:
        return {}
    return {NewGELUActivation: GELUTanh}


def use_fused_kernels(model: torch.nn.Module, info: DeviceInfo, enabled: bool = True) -> list[str]:
    """Replace, in place, each submodule that has a fused equivalent; return the names replaced."""
    if not enabled or info.kind == "hpu":
        return []
    swaps = _swaps()
    replaced = []
    for parent_name, parent in list(model.named_modules()):
        for name, child in list(parent.named_children()):
            fused = swaps.get(type(child))  # the exact class: a subclass may compute something else
            if fused is not None:
                setattr(parent, name, fused())
                replaced.append(f"{parent_name}.{name}" if parent_name else name)
    return replaced
