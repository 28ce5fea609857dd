"""Converts a Llama-family causal LM (a GGUF file or an HF folder) into the folder OpenVINO GenAI reads.

Out: `openvino_model.xml/.bin` (fp32 weights, stateful: the KV cache is internal state, reordered by a
`beam_idx` input, as optimum-intel exports it), `openvino_tokenizer.xml` / `openvino_detokenizer.xml`
(openvino-tokenizers, the chat template in their rt_info) and the HF `config.json` (the shapes LoRA
adapters are checked against). OpenVINO GenAI reads GGUF itself, but its graph of this Q4_1 SmolLM2
gives other greedy text than transformers from the first tokens on; converting transformers' own
module gives the same text. Runs offline: no hub access.
"""
from __future__ import annotations

import shutil
from pathlib import Path

MODEL_XML = "openvino_model.xml"
TOKENIZER_XML = "openvino_tokenizer.xml"
DETOKENIZER_XML = "openvino_detokenizer.xml"


def load_hf(source: Path):
    """(tokenizer, fp32 model) from a GGUF file or an HF folder, with transformers, offline."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if source.is_file():
        kwargs = {"gguf_file": source.name}
        folder = source.parent
    else:
        kwargs, folder = {}, source
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True, **kwargs)
    model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True, dtype=torch.float32, **kwargs)
    return tokenizer, model.eval()


def convert(source: Path, out: Path) -> None:
    """Write the OpenVINO GenAI folder for `source` (a .gguf file or an HF folder) into `out`."""
    import openvino as ov
    from openvino_tokenizers import convert_tokenizer

    tokenizer, model = load_hf(source)
    staging = out.with_name(out.name + ".partial")  # a crash leaves no half-written model folder
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    ov.save_model(export_model(model), staging / MODEL_XML, compress_to_fp16=False)
    ov_tokenizer, ov_detokenizer = convert_tokenizer(tokenizer, with_detokenizer=True)
    ov.save_model(ov_tokenizer, staging / TOKENIZER_XML)
    ov.save_model(ov_detokenizer, staging / DETOKENIZER_XML)
    config = model.config.to_dict()
    config.pop("quantization_config", None)  # a GGUF-loaded config remembers its quantisation
    (staging / "config.json").write_text(type(model.config)(**config).to_json_string())
    shutil.rmtree(out, ignore_errors=True)
    staging.rename(out)


def export_model(model):
    """The traced `openvino.Model` of `model` with its KV cache made stateful."""
    import openvino as ov
    import torch

    config = model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    past = [torch.zeros(1, config.num_key_value_heads, 2, head_dim) for _ in range(2 * config.num_hidden_layers)]
    example = {"input_ids": torch.ones(1, 3, dtype=torch.long), "attention_mask": torch.ones(1, 5, dtype=torch.long),
               "position_ids": torch.arange(2, 5)[None], "past": past}
    with torch.no_grad():
        traced = ov.convert_model(_with_flat_cache(model), example_input=example)
    make_stateful(traced, config.num_hidden_layers, config.num_key_value_heads, head_dim)
    return traced


def _with_flat_cache(model):
    """`model` as a module whose KV cache comes in and goes out as flat tensors (key, value per layer)."""
    import torch
    from transformers import DynamicCache

    class WithFlatCache(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model  # module paths stay `model.model.layers.N...`, which LoRA adapters match

        def forward(self, input_ids, attention_mask, position_ids, past):
            cache = DynamicCache(config=model.config)
            # Set each layer's tensors directly: `update` on an empty layer concatenates onto a
            # rank-1 empty tensor, which OpenVINO's converter refuses.
            for i, layer in enumerate(cache.layers):
                layer.dtype, layer.device = past[0].dtype, past[0].device
                layer.keys, layer.values, layer.is_initialized = past[2 * i], past[2 * i + 1], True
            out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                             past_key_values=cache, use_cache=True)
            return (out.logits, *[t for layer in out.past_key_values.layers for t in (layer.keys, layer.values)])

    return WithFlatCache()


def make_stateful(model, num_layers: int, num_kv_heads: int, head_dim: int) -> None:
    """Name the ports as optimum-intel does, add `beam_idx` (a Gather on every cache input, for beam
    search), then hide the cache inputs/outputs as state initialised to zeros of the batch's size."""
    import numpy as np
    import openvino as ov
    from openvino import opset13 as ops
    from openvino._offline_transformations import apply_make_stateful_transformation

    model.outputs[0].get_tensor().set_names({"logits"})
    pairs = {}
    for i in range(num_layers):
        for j, kind in enumerate(("key", "value")):
            past, present = f"past_key_values.{i}.{kind}", f"present.{i}.{kind}"
            model.inputs[3 + 2 * i + j].get_tensor().set_names({past})
            model.outputs[1 + 2 * i + j].get_tensor().set_names({present})
            pairs[past] = present
    beam_idx = ops.parameter(ov.PartialShape([model.input("input_ids").get_partial_shape()[0]]), ov.Type.i32,
                             name="beam_idx")
    beam_idx.output(0).get_tensor().set_names({"beam_idx"})
    model.add_parameters([beam_idx])
    for name in pairs:
        port = model.input(name)
        consumers = port.get_target_inputs()  # read before the Gather becomes one more consumer
        reordered = ops.gather(port, beam_idx, ops.constant(0))
        for consumer in consumers:
            consumer.replace_source_output(reordered.output(0))
    model.validate_nodes_and_infer_types()
    apply_make_stateful_transformation(model, pairs)
    batch = ops.gather(ops.shape_of(model.input("input_ids"), output_type="i64"), ops.constant([0]), ops.constant(0))
    empty_cache = ops.concat([batch, ops.constant(np.array([num_kv_heads, 0, head_dim], np.int64))], 0)
    for op in model.get_ops():
        if op.get_type_name() == "ReadValue":
            op.set_arguments([ops.broadcast(ops.constant(0.0, dtype=ov.Type.f32), empty_cache)])
    model.validate_nodes_and_infer_types()
