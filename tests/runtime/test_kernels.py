"""Fused kernels swapped in off HPU (--fused_kernels) and the flat gradient clip of fast_ddp's buffer."""

from __future__ import annotations

import os

import pytest
import torch

from gaudi_launch.runtime.device import DeviceInfo
from gaudi_launch.runtime.kernels import use_fused_kernels
from gaudi_launch.runtime.optim import clip_flat_grad_norm

transformers = pytest.importorskip("transformers")
from transformers.activations import GELUTanh, NewGELUActivation  # noqa: E402

CPU = DeviceInfo("cpu", torch.device("cpu"), "gloo", False, 0)
HPU = DeviceInfo("hpu", torch.device("cpu"), "hccl", True, 0)  # kind is all use_fused_kernels reads
ASSETS = os.path.join(os.path.dirname(__file__), "..", "..", "gaudi_launch", "runtime", "assets")


def tiny_gpt2() -> torch.nn.Module:
    config = transformers.AutoConfig.from_pretrained(os.path.join(ASSETS, "tiny-gpt2"))
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config)


def test_gelu_new_becomes_one_fused_kernel_with_the_same_training_signal():
    model, fused = tiny_gpt2(), tiny_gpt2()
    names = use_fused_kernels(fused, CPU)
    assert names == ["transformer.h.0.mlp.act", "transformer.h.1.mlp.act"]
    assert all(type(m) is GELUTanh for m in (fused.transformer.h[0].mlp.act, fused.transformer.h[1].mlp.act))
    assert not any(isinstance(m, NewGELUActivation) for m in fused.modules())
    ids = torch.randint(0, 1024, (4, 32), generator=torch.Generator().manual_seed(1))
    a, b = model(input_ids=ids, labels=ids), fused(input_ids=ids, labels=ids)
    torch.testing.assert_close(b.logits, a.logits, atol=1e-5, rtol=1e-5)  # rounding, not a different function
    a.loss.backward()
    b.loss.backward()
    for p, q in zip(model.parameters(), fused.parameters()):
        torch.testing.assert_close(q.grad, p.grad, atol=1e-5, rtol=1e-4)
    assert fused.state_dict().keys() == model.state_dict().keys()  # nothing saved changes


def test_hpu_and_opt_out_keep_the_models_own():
    for info, enabled in ((HPU, True), (CPU, False)):
        model = tiny_gpt2()
        assert use_fused_kernels(model, info, enabled) == []
        assert type(model.transformer.h[0].mlp.act) is NewGELUActivation


@pytest.mark.parametrize("max_norm", [0.5, 1e6])  # clipped, and left alone
def test_flat_clip_equals_clip_grad_norm(max_norm):
    g = torch.Generator().manual_seed(0)
    shapes = [(16, 8), (16,), (3, 16), (3,)]
    flat = torch.randn(sum(torch.Size(s).numel() for s in shapes), generator=g)
    views, offset = [], 0
    for s in shapes:
        n = torch.Size(s).numel()
        views.append(flat[offset : offset + n].view(s))
        offset += n
    params = [torch.nn.Parameter(torch.zeros(s)) for s in shapes]
    for p, v in zip(params, views):
        p.grad = v.clone()
    expected = torch.nn.utils.clip_grad_norm_(params, max_norm)
    total = clip_flat_grad_norm(flat, max_norm)
    torch.testing.assert_close(total, expected)
    for p, v in zip(params, views):
        torch.testing.assert_close(v, p.grad)  # the views were scaled in place, as the grads were
