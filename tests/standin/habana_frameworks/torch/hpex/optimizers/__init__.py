"""Stand-in for habana_frameworks.torch.hpex.optimizers."""
from __future__ import annotations

import torch

from habana_frameworks import record


class FusedAdamW(torch.optim.AdamW):
    """Records construction and each step; the update itself is torch's AdamW."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=1e-2, **kwargs):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
        record("FusedAdamW", lr=lr, eps=eps, groups=len(self.param_groups))

    def step(self, closure=None):
        record("FusedAdamW.step")
        return super().step(closure)
