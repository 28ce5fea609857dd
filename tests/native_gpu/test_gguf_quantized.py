"""GGUF files with quantized tensors: loaded lazily and kept in their blocks (no fp32 copy), an engine on
them agrees with one on the dequantized weights, and bad files fail naming the tensor and the problem."""
import os

import numpy as np
import pytest
import torch
from helpers.hidden_states import every_row_hidden_states
from helpers.load_memory import measure_load
from helpers.tiny_gguf import VOCAB, tensor_plans, write_tiny

from modelplex_native_gpu.config import EngineConfig
from modelplex_native_gpu.engine.llm_engine import LLMEngine
from modelplex_native_gpu.engine.sampling_params import SamplingParams
from modelplex_native_gpu.errors import ModelLoadError
from modelplex_native_gpu.layers.linear import Linear
from modelplex_native_gpu.layers.quantized import QuantizedWeight
from modelplex_native_gpu.loader import load_weights

TYPES = ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q4_K", "Q5_K", "Q6_K"]


def engine(path, quantized):
    torch.set_num_threads(2)
    return LLMEngine(EngineConfig(model=path, device="cpu", dtype="float32", quantized_weights=quantized,
                                  max_model_len=256, kv_cache_memory_bytes=16 << 20, skip_tokenizer_init=True,
                                  enable_prefix_caching=False))


def all_logits(e, ids):
    """Teacher-forced logits at every position of `ids` (one prefill step)."""
    model = e.runner.model
    with every_row_hidden_states(model) as captured:
        e.generate([ids], SamplingParams(temperature=0, max_tokens=1))
    with torch.inference_mode():
        return model.compute_logits(captured[0])


@pytest.mark.parametrize("type_name", TYPES)
def test_engine_on_quantized_weights_matches_the_dequantized_ones(tmp_path, type_name):
    path = write_tiny(tmp_path / f"tiny-{type_name}.gguf", type_name)
    quantized, dequantized = engine(path, True), engine(path, False)
    linears = [m for m in quantized.runner.model.modules() if isinstance(m, Linear)]
    assert all(m.weight is None and m.quantized is not None for m in linears)  # no fp32 copy kept
    assert isinstance(quantized.runner.model.embed_tokens, QuantizedWeight)  # Q8_0, shared by the tied head
    assert quantized.runner.model.lm_head.quantized is quantized.runner.model.embed_tokens
    assert quantized.runner.weight_bytes < dequantized.runner.weight_bytes / 3
    ids = [int(t) for t in np.random.default_rng(0).integers(3, VOCAB, 40)]
    got, want = all_logits(quantized, ids), all_logits(dequantized, ids)
    scale = want.abs().max().item()
    assert (got - want).abs().max().item() <= 1e-3 * scale, type_name
    assert (got.argmax(-1) == want.argmax(-1)).float().mean().item() >= 0.95


@pytest.mark.parametrize("type_name", ["Q8_0", "Q4_0", "Q4_1"])
@pytest.mark.parametrize("threads", [1, 2])
def test_the_one_call_decode_step_and_layer_equal_the_layer_op_by_op(tmp_path, type_name, threads, monkeypatch):
    """Decode steps through csrc/decode_step.cpp (all layers, one call, one parallel region on the 16-row groups)
    and through csrc/decode_layer.cpp (a call a layer) give bit for bit the hidden states of the Python layer,
    one sequence or three decoding together."""
    from modelplex_native_gpu.models.llama import LlamaDecoderLayer, LlamaForCausalLM

    e = engine(write_tiny(tmp_path / f"tiny-{type_name}.gguf", type_name), True)
    torch.set_num_threads(threads)
    model = e.runner.model
    assert all(layer.quantized_decode_weights() is not None for layer in model.layers)
    step_calls, layer_calls = [], []
    monkeypatch.setattr(model.fused_ops, "quant_decode_layers", counted(model.fused_ops, step_calls, "quant_decode_layers"),
                        raising=False)
    monkeypatch.setattr(model.fused_ops, "quant_decode_layer", counted(model.fused_ops, layer_calls), raising=False)
    rng = np.random.default_rng(1)
    prompts = [[int(t) for t in rng.integers(3, VOCAB, n)] for n in (12, 7, 20)]

    def hidden_states():
        captured = []
        forward = model.forward
        model.forward = lambda *a, **k: captured.append(forward(*a, **k)) or captured[-1]
        try:
            for batch in (prompts[:1], prompts):
                e.generate(batch, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
        finally:
            del model.forward
        return captured

    regions = torch.ops.modelplex_cpu.quant_region_steps()
    whole_step = hidden_states()
    repacked = model.layers[0].quantized_decode_weights()[1] >= 1000  # where the build has the 16-row kernels
    assert len(step_calls) == (10 if repacked else 0) and len(layer_calls) == (0 if repacked else 10 * len(model.layers))
    assert torch.ops.modelplex_cpu.quant_region_steps() - regions == len(step_calls)  # not its layer by layer fallback
    monkeypatch.setattr(LlamaForCausalLM, "_decode_step_weights", lambda self, ropes: None)
    per_layer = hidden_states()
    assert len(layer_calls) == (10 if repacked else 20) * len(model.layers)
    monkeypatch.setattr(LlamaDecoderLayer, "quantized_decode_weights", lambda self: None)
    op_by_op = hidden_states()
    assert len(whole_step) == len(per_layer) == len(op_by_op) == 12
    for a, b, c in zip(whole_step, per_layer, op_by_op):
        assert torch.equal(a, c) and torch.equal(b, c)


@pytest.mark.parametrize("type_name", ["Q4_0", "Q4_1", "Q8_0"])
def test_repacked_at_load_and_its_tied_embedding_still_looks_rows_up(tmp_path, type_name):
    """Where the build has the 16-row kernel every Q4_0 / Q4_1 / Q8_0 weight is repacked at load (kernels/csrc/
    quant_repack.cpp), the embedding table shared by the tied LM head too: its rows still dequantize to the
    file's values bit for bit, and the logits of a prefill (many tokens a linear) agree with the dequantized
    engine's."""
    path = write_tiny(tmp_path / f"tiny-{type_name}.gguf", type_name, embd_type=type_name)
    quantized, dequantized = engine(path, True), engine(path, False)
    table = quantized.runner.model.embed_tokens
    qtype = {"Q4_0": 2, "Q4_1": 3, "Q8_0": 8}[type_name]
    repacked = type_name + "x16" if table.ops.quant_repacked_type(qtype) != qtype else type_name
    assert {m.quantized.type_names for m in quantized.runner.model.modules() if isinstance(m, Linear)} == {repacked}
    assert table.type_names == repacked and quantized.runner.model.lm_head.quantized is table
    ids = [int(t) for t in np.random.default_rng(2).integers(3, VOCAB, 40)]
    assert torch.equal(table.rows(torch.tensor(ids)), dequantized.runner.model.embed_tokens[ids])
    got, want = all_logits(quantized, ids), all_logits(dequantized, ids)
    assert (got - want).abs().max().item() <= 1e-3 * want.abs().max().item()
    assert (got.argmax(-1) == want.argmax(-1)).float().mean().item() >= 0.95


def counted(ops, calls, name="quant_decode_layer"):
    op = getattr(ops, name)

    def call(*args):
        calls.append(1)
        return op(*args)
    return call


def test_mixed_types_in_a_fused_projection(tmp_path):
    """Q4_K_M files give attn_v and ffn_down Q6_K beside Q4_K: the fused q/k/v keeps one segment a type."""
    plans = tensor_plans("Q4_K")
    from helpers.quant_check import make_weight

    for p in plans:
        if p.name.endswith(("attn_v.weight", "ffn_down.weight")):
            p.type_name = "Q6_K"
            p.make = lambda shape=p.shape: make_weight("Q6_K", *shape, seed=7)
    path = write_tiny(tmp_path / "mixed.gguf", "Q4_K", plans=plans)
    quantized, dequantized = engine(path, True), engine(path, False)
    qkv = quantized.runner.model.layers[0].self_attn.qkv_proj.quantized
    assert qkv.type_names == "Q4_K+Q6_K"
    ids = list(range(3, 30))
    got, want = all_logits(quantized, ids), all_logits(dequantized, ids)
    assert (got - want).abs().max().item() <= 1e-3 * want.abs().max().item()


def test_an_unsupported_type_names_the_tensor_its_type_and_the_supported_ones(tmp_path):
    plans = tensor_plans("Q8_0")
    plans[3].type_name, plans[3].raw = "Q5_1", False
    plans[3].make = lambda shape=plans[3].shape: np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    path = write_tiny(tmp_path / "q51.gguf", "Q8_0", plans=plans)
    with pytest.raises(ModelLoadError, match=r"tensor 'blk\.0\.attn_v\.weight' has GGUF type Q5_1.*supported types: "
                                             r"F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q4_K, Q5_K, Q6_K"):
        load_weights(path)


def test_a_truncated_file_is_a_load_error(tmp_path):
    path = write_tiny(tmp_path / "cut.gguf", "Q4_0")
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size - 1000)
    with pytest.raises(ModelLoadError, match="truncated"):
        load_weights(path)
    with open(path, "r+b") as f:
        f.truncate(200)  # inside the metadata
    with pytest.raises(ModelLoadError, match="not a readable GGUF file"):
        load_weights(path)


def test_a_tensor_whose_size_disagrees_with_its_shape_is_a_load_error(tmp_path):
    import gguf
    from helpers.tiny_gguf import metadata

    writer = gguf.GGUFWriter(str(tmp_path / "bad.gguf"), "llama")
    metadata(writer)
    plans = tensor_plans("Q8_0")
    for p in plans:  # token_embd declares 320 rows but holds the bytes of 160
        nbytes = (p.make().nbytes // 2) if p.name == "token_embd.weight" else p.make().nbytes
        writer.add_tensor_info(p.name, p.shape, np.dtype(np.float32), nbytes, raw_dtype=gguf.GGMLQuantizationType[p.type_name])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for p in plans:
        data = p.make()
        writer.write_tensor_data(data[:VOCAB // 2] if p.name == "token_embd.weight" else data)
    writer.close()
    with pytest.raises(ModelLoadError, match="token_embd.weight.*size disagrees with its shape"):
        load_weights(str(tmp_path / "bad.gguf"))


def test_rows_that_are_not_whole_blocks_are_a_load_error(tmp_path):
    import gguf
    from helpers.tiny_gguf import metadata

    writer = gguf.GGUFWriter(str(tmp_path / "rows.gguf"), "llama")
    metadata(writer)
    writer.add_tensor_info("token_embd.weight", (4, 48), np.dtype(np.float32), 4 * 51,
                           raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.write_tensor_data(np.zeros(4 * 51, np.uint8))
    writer.close()
    with pytest.raises(ModelLoadError, match="not a readable GGUF file.*(block|multiple)"):
        load_weights(str(tmp_path / "rows.gguf"))


def test_loading_peaks_within_1_2x_of_the_resident_weights(tmp_path):
    """A 70 MB Q8_0 model (16 layers of 1024 wide): loading streams tensor by tensor, never fp32."""
    import helpers.tiny_gguf as tiny

    path = tmp_path / "mid.gguf"
    saved = (tiny.HIDDEN, tiny.FFN, tiny.LAYERS)
    tiny.HIDDEN, tiny.FFN, tiny.LAYERS = 1024, 2048, 8
    try:
        write_tiny(path, "Q8_0")
    finally:
        tiny.HIDDEN, tiny.FFN, tiny.LAYERS = saved
    m = measure_load(model=str(path), device="cpu", dtype="float32", quantized_weights=True, max_model_len=64,
                     kv_cache_memory_bytes=4 << 20, skip_tokenizer_init=True)
    assert m.weight_bytes > 60e6
    assert m.after - m.before >= 0.9 * m.weight_bytes  # the weights are resident ...
    assert m.peak_over_final <= 1.2, m  # ... and loading peaked near them

