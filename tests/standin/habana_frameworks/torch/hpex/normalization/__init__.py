"""Stand-in for habana_frameworks.torch.hpex.normalization.FusedClipNorm.

As python_packages/habana_frameworks/torch/hpex/normalization/FusedClipNorm.py (bridge 1.19):
``max_norm`` is kept as a tensor on the device; ``clip_norm`` marks a step before and after (in
lazy mode), skips parameters without a gradient and returns the total norm as a device tensor.
"""

from __future__ import annotations

import torch
from habana_frameworks import record
from habana_frameworks.torch import core as htcore


class FusedClipNorm:
    def __init__(self, parameters, max_norm) -> None:
        params = list(parameters)
        self.dtype = params[0].dtype if params else torch.float32
        self.max_norm_t = (torch.ones(1) * max_norm).to(self.dtype).to(torch.device("hpu"))
        self.norm_type = 2.0
        record("FusedClipNorm", max_norm=max_norm, n_params=len(params))

    @torch.no_grad()
    def clip_norm(self, parameters):
        record("FusedClipNorm.clip_norm")
        htcore.step_closure._mark_step_if_lazy()
        if isinstance(parameters, torch.Tensor):
            parameters = [parameters]
        grads = [p.grad for p in parameters if p.grad is not None]
        if not grads:
            return torch.tensor(0.0)
        total = torch.stack([g.float().norm(self.norm_type) for g in grads]).norm(self.norm_type)
        coef = torch.clamp(self.max_norm_t.float() / (total + 1e-6), max=1.0)
        for g in grads:
            g.mul_(coef.to(g.dtype))
        htcore.step_closure._mark_step_if_lazy()
        return total
