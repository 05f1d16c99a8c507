"""Stand-in for habana_frameworks.torch.hpex.normalization."""
from __future__ import annotations

import torch

from habana_frameworks import record


class FusedClipNorm:
    def __init__(self, parameters, max_norm: float) -> None:
        self.max_norm = max_norm
        record("FusedClipNorm", max_norm=max_norm, n_params=len(list(parameters)))

    def clip_norm(self, parameters):
        record("FusedClipNorm.clip_norm")
        return torch.nn.utils.clip_grad_norm_(list(parameters), self.max_norm)
