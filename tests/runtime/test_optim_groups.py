"""Weight-decay groups by transformers' rule (Trainer.get_decay_parameter_names), compared with transformers'
own function on models where a name-suffix rule and it disagree: T5's relative_attention_bias (an Embedding's
weight, exempt by name), BatchNorm (decayed by transformers, its names hold no norm pattern), GroupNorm named
*_norm and a module named "norm" (exempt), a LayerNorm named "ln" (exempt by type)."""

from __future__ import annotations

import torch
from transformers import AutoConfig, AutoModelForSeq2SeqLM
from transformers import Trainer as HFTrainer

from gaudi_launch.runtime.args import TrainingArguments
from gaudi_launch.runtime.data import ASSETS
from gaudi_launch.runtime.device import DeviceInfo
from gaudi_launch.runtime.optim import make_optimizer, param_groups


class Mixed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.bn = torch.nn.BatchNorm2d(4)
        self.group_norm = torch.nn.GroupNorm(2, 4)
        self.norm = torch.nn.LayerNorm(4)
        self.ln = torch.nn.LayerNorm(4)
        self.pos_bias_table = torch.nn.Parameter(torch.zeros(3, 4))  # Swin-style relative position table
        self.scale = torch.nn.Parameter(torch.ones(4))  # a top-level parameter, decayed by name


def _hf_groups(model):
    """transformers' decay set, as the names of named_parameters (what create_optimizer matches)."""
    names = set(HFTrainer.get_decay_parameter_names(None, model))
    decay = [n for n, p in model.named_parameters() if n in names and p.requires_grad]
    return decay, [n for n, p in model.named_parameters() if n not in names and p.requires_grad]


def _our_groups(model):
    by_id = {id(p): n for n, p in model.named_parameters()}
    decay, no_decay = param_groups(model, 0.1)
    return [by_id[id(p)] for p in decay["params"]], [by_id[id(p)] for p in no_decay["params"]]


def test_t5_relative_attention_bias_is_not_decayed_as_in_transformers():
    model = AutoModelForSeq2SeqLM.from_config(AutoConfig.from_pretrained(f"{ASSETS}/tiny-t5"))
    decay, no_decay = _our_groups(model)
    assert (decay, no_decay) == _hf_groups(model)
    assert any("relative_attention_bias" in n for n in no_decay)
    assert any("layer_norm" in n for n in no_decay)


def test_batchnorm_is_decayed_and_norm_names_are_not_as_in_transformers():
    model = Mixed()
    decay, no_decay = _our_groups(model)
    assert (decay, no_decay) == _hf_groups(model)
    assert {"bn.weight", "bn.bias"} & set(decay) == {"bn.weight"}
    assert {"group_norm.weight", "norm.weight", "ln.weight", "pos_bias_table"} <= set(no_decay)
    assert "scale" in decay


def test_the_optimizer_gets_those_groups():
    model = Mixed()
    opt = make_optimizer(
        model, TrainingArguments(weight_decay=0.1), DeviceInfo("cpu", torch.device("cpu"), "gloo", False, 0), None
    )
    assert [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.0]
    assert any(p is model.bn.weight for p in opt.param_groups[0]["params"])
