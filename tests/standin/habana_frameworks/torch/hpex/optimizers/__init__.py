"""Stand-in for habana_frameworks.torch.hpex.optimizers.FusedAdamW.

As python_packages/habana_frameworks/torch/hpex/optimizers/FusedAdamW.py (bridge 1.19): defaults
lr=1e-3, eps=1e-6, weight_decay=0.0; the step count lives in ``group["step"]`` (no per-parameter
``state["step"]``); bias correction is folded into the step size; decoupled weight decay is
``w *= 1 - wd * lr``; ``step`` marks a step before each group and after the update (in lazy mode).
The update is computed here with torch ops on the device tensors, as the fused kernel would.
"""

from __future__ import annotations

import math

import torch
from habana_frameworks import record
from habana_frameworks.torch import core as htcore


class FusedAdamW(torch.optim.Optimizer):
    def __init__(
        self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0, bias_correction=True, moments_dtype=None
    ):
        if lr < 0.0:
            raise ValueError(f"Invalid learning rate: {lr} - should be >= 0.0")
        if not 0.0 <= betas[0] < 1.0 or not 0.0 <= betas[1] < 1.0:
            raise ValueError(f"Invalid beta parameter: {betas}")
        if not 0.0 <= eps:
            raise ValueError(f"Invalid epsilon value: {eps} - should be >= 0.0")
        super().__init__(
            params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, bias_correction=bias_correction)
        )
        record("FusedAdamW", lr=lr, eps=eps, weight_decay=weight_decay, groups=len(self.param_groups))

    @torch.no_grad()
    def step(self, closure=None):
        record("FusedAdamW.step")
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            htcore.step_closure._mark_step_if_lazy()
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            group["step"] = group.get("step", 0) + 1
            beta1, beta2 = group["betas"]
            step_size = group["lr"]
            if group.get("bias_correction", True):
                step_size *= math.sqrt(1.0 - beta2 ** group["step"]) / (1.0 - beta1 ** group["step"])
            for p in params:
                if p.grad.is_sparse:
                    raise RuntimeError("Adam does not support sparse gradients, please consider SparseAdam")
                state = self.state[p]
                if not state:
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
                exp_avg.mul_(beta1).add_(p.grad, alpha=1.0 - beta1)
                exp_avg_sq.mul_(beta2).addcmul_(p.grad, p.grad, value=1.0 - beta2)
                p.mul_(1.0 - group["weight_decay"] * group["lr"])
                p.addcdiv_(exp_avg, exp_avg_sq.sqrt().add_(group["eps"]), value=-step_size)
        htcore.step_closure._mark_step_if_lazy()
        return loss
