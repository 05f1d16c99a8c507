"""--attn_implementation gaudi_fused_sdpa: FusedSDPA on HPU (checked against the recording stand-in,
whose kernel computes with torch's SDPA), torch's SDPA elsewhere, and the flags that go with it."""

from __future__ import annotations

import os
import warnings

import pytest
import torch
import transformers

from gaudi_launch.runtime.args import TrainingArguments, parse_args
from gaudi_launch.runtime.attention import FUSED_SDPA, apply_attention, resolve_attn_implementation
from gaudi_launch.runtime.data import ASSETS
from gaudi_launch.runtime.device import DeviceInfo, select_device
from gaudi_launch.runtime.trainer import Trainer

CPU = DeviceInfo("cpu", torch.device("cpu"), "gloo", False, 0)


def gpt2(seed: int = 0) -> transformers.PreTrainedModel:
    config = transformers.AutoConfig.from_pretrained(os.path.join(ASSETS, "tiny-gpt2"))
    torch.manual_seed(seed)
    return transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()


def llama_gqa(seed: int = 0) -> transformers.PreTrainedModel:
    # 4 query heads share 2 key/value heads: the kernel must see keys/values for every query head.
    config = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(config).eval()


def fused_calls(calls, start=0):
    return [d for n, d in calls[start:] if n == "FusedSDPA.apply"]


@pytest.mark.parametrize(
    "requested, kind, expected",
    [
        (None, "hpu", None),
        (None, "cpu", None),
        (FUSED_SDPA, "hpu", FUSED_SDPA),
        (FUSED_SDPA, "cuda", "sdpa"),
        (FUSED_SDPA, "cpu", "sdpa"),
        ("eager", "hpu", "eager"),
        ("sdpa", "cpu", "sdpa"),
    ],
)
def test_resolve_attn_implementation(requested, kind, expected):
    assert resolve_attn_implementation(requested, kind) == expected


@pytest.mark.parametrize(
    "flag", ["flash_attention_recompute", "flash_attention_causal_mask", "flash_attention_fast_softmax"]
)
def test_flash_flags_need_the_fused_kernel(flag):
    with pytest.raises(ValueError, match=f"--{flag} only apply .* add --attn_implementation gaudi_fused_sdpa"):
        TrainingArguments(**{flag: True})
    TrainingArguments(**{flag: True, "attn_implementation": FUSED_SDPA})  # fine together


def test_flash_flags_parse_from_argv_like_optimum_habana():
    (a,) = parse_args(
        (TrainingArguments,),
        [
            "--attn_implementation",
            "gaudi_fused_sdpa",
            "--flash_attention_recompute",
            "--flash_attention_causal_mask",
            "true",
        ],
    )
    assert (
        a.attn_implementation,
        a.flash_attention_recompute,
        a.flash_attention_causal_mask,
        a.flash_attention_fast_softmax,
    ) == (FUSED_SDPA, True, True, False)


def test_older_use_flash_attention_flag_means_the_fused_kernel():
    (a,) = parse_args((TrainingArguments,), ["--use_flash_attention", "--flash_attention_causal_mask"])
    assert (a.attn_implementation, a.flash_attention_causal_mask) == (FUSED_SDPA, True)
    with pytest.raises(ValueError, match="pass only one of them"):
        TrainingArguments(use_flash_attention=True, attn_implementation="eager")


def test_on_cpu_the_fused_request_becomes_torch_sdpa_with_a_warning():
    model = gpt2()
    with pytest.warns(UserWarning, match="on cpu the model uses torch's scaled_dot_product_attention"):
        used = apply_attention(model, TrainingArguments(attn_implementation=FUSED_SDPA), CPU)
    assert used == "sdpa" and model.config._attn_implementation == "sdpa"


def test_no_request_leaves_the_model_alone():
    model = gpt2()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert apply_attention(model, TrainingArguments(), CPU) is None
    assert model.config._attn_implementation == "eager"


def test_a_model_outside_transformers_keeps_its_attention_with_a_warning():
    with pytest.warns(UserWarning, match="Linear is not a transformers model"):
        assert apply_attention(torch.nn.Linear(2, 2), TrainingArguments(attn_implementation="sdpa"), CPU) is None


def test_stand_in_fused_sdpa_gives_eager_logits_and_gradients_on_gpt2(hpu_stand_in):
    info = select_device(TrainingArguments(device="hpu"))
    ids = torch.randint(0, 1000, (2, 16))
    reference, fused = gpt2(), gpt2().to(info.device)
    assert apply_attention(fused, TrainingArguments(attn_implementation=FUSED_SDPA), info) == FUSED_SDPA
    start = len(hpu_stand_in)
    hids = ids.to(info.device)
    out_ref, out = reference(ids, labels=ids), fused(hids, labels=hids)
    torch.testing.assert_close(out.logits.cpu(), out_ref.logits, atol=1e-5, rtol=1e-5)
    out_ref.loss.backward()
    out.loss.backward()
    for (name, p_ref), p in zip(reference.named_parameters(), fused.parameters()):
        torch.testing.assert_close(p.grad.cpu(), p_ref.grad, atol=1e-5, rtol=1e-4, msg=name)
    calls = fused_calls(hpu_stand_in, start)
    assert len(calls) == reference.config.n_layer  # every block's attention went through the kernel
    # No padding: no mask is read, the kernel applies causality itself.
    assert all(c["mask"] is None and c["is_causal"] is True for c in calls)
    assert all((c["softmax_mode"], c["recompute_mode"]) == ("None", False) for c in calls)


def test_stand_in_fused_sdpa_honours_a_padding_mask(hpu_stand_in):
    info = select_device(TrainingArguments(device="hpu"))
    ids = torch.randint(0, 1000, (2, 12))
    mask = torch.ones_like(ids)
    mask[1, 8:] = 0  # right padding on the second sample
    reference, fused = gpt2(), gpt2().to(info.device)
    apply_attention(fused, TrainingArguments(attn_implementation=FUSED_SDPA), info)
    start = len(hpu_stand_in)
    got = fused(ids.to(info.device), attention_mask=mask.to(info.device)).logits.cpu()
    want = reference(ids, attention_mask=mask).logits
    torch.testing.assert_close(got[mask.bool()], want[mask.bool()], atol=1e-5, rtol=1e-5)
    calls = fused_calls(hpu_stand_in, start)
    # transformers' sdpa_mask is boolean; the kernel gets the additive float mask optimum-habana gives
    # it (issue 23, item 10: before, the boolean mask went through as it was).
    assert calls and all(c["mask"] == "torch.float32" and c["is_causal"] is False for c in calls)


def test_stand_in_fused_sdpa_options_reach_the_kernel(hpu_stand_in):
    info = select_device(TrainingArguments(device="hpu"))
    model = gpt2().to(info.device)
    apply_attention(
        model,
        TrainingArguments(
            attn_implementation=FUSED_SDPA,
            flash_attention_recompute=True,
            flash_attention_causal_mask=True,
            flash_attention_fast_softmax=True,
        ),
        info,
    )
    ids = torch.randint(0, 1000, (2, 8)).to(info.device)
    start = len(hpu_stand_in)
    model(ids, attention_mask=torch.ones_like(ids))
    calls = fused_calls(hpu_stand_in, start)
    assert calls and all(
        (c["mask"], c["is_causal"], c["softmax_mode"], c["recompute_mode"]) == (None, True, "fast", True) for c in calls
    )


def test_stand_in_fused_sdpa_takes_grouped_key_value_heads_as_they_are(hpu_stand_in):
    # The kernel handles grouped-query attention itself (FusedSDPA.py: is_gqa): K/V are not repeated.
    info = select_device(TrainingArguments(device="hpu"))
    ids = torch.randint(0, 64, (2, 10))
    reference, fused = llama_gqa(), llama_gqa().to(info.device)
    apply_attention(fused, TrainingArguments(attn_implementation=FUSED_SDPA), info)
    start = len(hpu_stand_in)
    torch.testing.assert_close(fused(ids.to(info.device)).logits.cpu(), reference(ids).logits, atol=1e-5, rtol=1e-5)
    calls = fused_calls(hpu_stand_in, start)
    assert calls and all(c["shape"][1] == 4 and c["kv_shape"][1] < 4 and c["gqa"] for c in calls)


def test_stand_in_trainer_trains_through_the_fused_kernel(hpu_stand_in, tmp_path):
    config = transformers.AutoConfig.from_pretrained(os.path.join(ASSETS, "tiny-gpt2"))
    data = [{"input_ids": ids, "labels": ids} for ids in torch.randint(0, config.vocab_size, (8, 16))]
    a = TrainingArguments(
        device="hpu",
        output_dir=str(tmp_path),
        max_steps=2,
        per_device_train_batch_size=4,
        save_steps=0,
        attn_implementation=FUSED_SDPA,
        flash_attention_recompute=True,
    )
    trainer = Trainer(gpt2().train(), a, train_dataset=data, log=lambda s: None)
    start = len(hpu_stand_in)
    trainer.train()
    calls = fused_calls(hpu_stand_in, start)
    assert len(calls) == 2 * config.n_layer and all(c["recompute_mode"] for c in calls)
    assert all(c["dropout_p"] == pytest.approx(config.attn_pdrop) for c in calls)  # training: dropout applies
