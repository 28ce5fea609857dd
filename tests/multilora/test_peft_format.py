"""`modelplex_multilora.peft.read_adapter` on adapters PEFT itself saved (a tiny random Llama), and
every folder it must refuse, each with its reason."""
from __future__ import annotations

import json
import math
import shutil

import pytest
import torch

from modelplex_multilora import BaseModelShape, InvalidAdapterError, read_adapter

HIDDEN, INTER, LAYERS, HEADS, KV_HEADS = 64, 128, 2, 4, 2
BASE = BaseModelShape.llama(HIDDEN, INTER, LAYERS, HEADS, KV_HEADS, HIDDEN // HEADS)


@pytest.fixture(scope="module")
def tiny_model():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128, hidden_size=HIDDEN, intermediate_size=INTER, num_hidden_layers=LAYERS,
                         num_attention_heads=HEADS, num_key_value_heads=KV_HEADS)
    return LlamaForCausalLM(config).eval()


def save_peft(model, folder, **config):
    from peft import LoraConfig, get_peft_model

    peft_model = get_peft_model(model, LoraConfig(**config))
    peft_model.save_pretrained(folder)
    peft_model.unload()  # the base model is shared by the tests
    return folder


@pytest.fixture(scope="module")
def adapter(tiny_model, tmp_path_factory):
    return save_peft(tiny_model, tmp_path_factory.mktemp("a") / "qv", r=4, lora_alpha=16,
                     target_modules=["q_proj", "v_proj", "down_proj"])


def test_reads_what_peft_saved(adapter, tiny_model, tmp_path):
    spec = read_adapter(adapter, BASE, max_lora_rank=16)
    assert (spec.rank, spec.lora_alpha, spec.use_rslora, spec.scaling) == (4, 16.0, False, 4.0)
    assert spec.target_modules == ("q_proj", "v_proj", "down_proj")
    assert sorted(spec.tensors) == [(layer, m) for layer in range(LAYERS) for m in ("down_proj", "q_proj", "v_proj")]
    a_key, b_key = spec.tensors[(1, "v_proj")]
    assert a_key.endswith("layers.1.self_attn.v_proj.lora_A.weight") and b_key.endswith("v_proj.lora_B.weight")
    rs = read_adapter(save_peft(tiny_model, tmp_path / "rs", r=16, lora_alpha=8, use_rslora=True,
                                target_modules=["o_proj"]), BASE, max_lora_rank=16)
    assert rs.scaling == 8 / math.sqrt(16) and rs.target_modules == ("o_proj",)


def broken_copy(adapter, tmp_path, edit_config=None, weights: dict | None = None):
    folder = tmp_path / "broken"
    shutil.copytree(adapter, folder)
    if edit_config is not None:
        config = json.loads((folder / "adapter_config.json").read_text())
        edit_config(config)
        (folder / "adapter_config.json").write_text(json.dumps(config))
    if weights is not None:
        from safetensors.torch import save_file

        save_file(weights, folder / "adapter_model.safetensors")
    return folder


@pytest.mark.parametrize("edit, reason", [
    (lambda c: c.update(r=32), "rank 32 is over max_lora_rank 16"),
    (lambda c: c.update(r=0), "r must be a positive integer"),
    (lambda c: c.update(target_modules=["q_proj", "c_attn"]), "target modules the base model lacks: c_attn"),
    (lambda c: c.update(use_dora=True), "use_dora is not supported"),
    (lambda c: c.update(bias="all"), "bias is not supported"),
    (lambda c: c.update(modules_to_save=["lm_head"]), "modules_to_save is not supported"),
    (lambda c: c.update(peft_type="IA3"), "peft_type 'IA3' is not LORA"),
    (lambda c: c.update(lora_alpha="big"), "lora_alpha must be a number"),
])
def test_config_refusals(adapter, tmp_path, edit, reason):
    with pytest.raises(InvalidAdapterError, match=reason):
        read_adapter(broken_copy(adapter, tmp_path, edit), BASE, max_lora_rank=16)


def test_shape_and_file_refusals(adapter, tmp_path):
    other_base = BaseModelShape.llama(96, INTER, LAYERS, HEADS, KV_HEADS, 24)
    with pytest.raises(InvalidAdapterError, match=r"has shape \[64, 4\] but the base model needs \[96, 4\]"):
        read_adapter(adapter, other_base, max_lora_rank=16)
    with pytest.raises(InvalidAdapterError, match="the base model has 1 layers"):
        read_adapter(adapter, BaseModelShape(1, BASE.modules), max_lora_rank=16)
    a = torch.zeros(4, HIDDEN)
    cases = [
        ({"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": a}, "layer 0 q_proj has no lora_B"),
        ({"base_model.model.lm_head.lora_A.weight": a}, "is not a LoRA A/B weight of a projection"),
        ({"base_model.model.model.layers.0.mlp.fc1.lora_A.weight": a}, "target modules the base model lacks: fc1"),
        ({"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": a.to(torch.int32)}, "dtype must be"),
    ]
    for weights, reason in cases:
        with pytest.raises(InvalidAdapterError, match=reason):
            read_adapter(broken_copy(adapter, tmp_path, weights=weights), BASE, max_lora_rank=16)
        shutil.rmtree(tmp_path / "broken")
    folder = broken_copy(adapter, tmp_path)
    (folder / "adapter_model.safetensors").write_bytes(b"\xff" * 16)
    with pytest.raises(InvalidAdapterError, match="not a safetensors file"):
        read_adapter(folder, BASE, max_lora_rank=16)
    (folder / "adapter_model.safetensors").unlink()
    with pytest.raises(InvalidAdapterError, match="adapter_model.safetensors is missing"):
        read_adapter(folder, BASE, max_lora_rank=16)
    (folder / "adapter_config.json").write_text("{not json")
    with pytest.raises(InvalidAdapterError, match="adapter_config.json is not valid JSON"):
        read_adapter(folder, BASE, max_lora_rank=16)
    with pytest.raises(InvalidAdapterError, match="adapter_config.json is missing"):
        read_adapter(tmp_path, BASE, max_lora_rank=16)
