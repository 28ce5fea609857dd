"""Qwen3, Gemma 2, Gemma 3 and Phi-3 (tiny random models with each family's peculiarities on): greedy
output token-identical to transformers `generate` at fp32, one request at a time, batched, in chunks,
from the prefix cache, and from the same weights written as GGUF."""
import pytest
import torch

from modelplex_native_gpu.engine.sampling_params import SamplingParams

FAMILIES = ["qwen3", "gemma2", "gemma3", "phi3"]
MAX_NEW = 12
SHARED = [(7 * i + 3) % 250 + 3 for i in range(40)]  # a 40-token prefix: 5 blocks of 8
PROMPTS = [SHARED + [11, 12, 13, 14, 15, 16], [9, 9, 200, 31] * 9, [(5 * i) % 240 + 3 for i in range(57)],
           SHARED[:33] + [77, 78]]


def greedy(engine, prompts):
    outs = engine.generate(prompts, SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True))
    return [o[0].token_ids for o in outs]


def assert_no_leak(engine):
    pool = engine.kv_cache_manager.block_pool
    assert not engine.has_unfinished_requests()
    assert pool.num_used_blocks == 0 and pool.num_free_blocks == engine.runner.num_blocks - 1


@pytest.fixture(scope="module", params=FAMILIES)
def family(request, tiny_family_model, hf_greedy):
    """(family, HF folder, HF model, HF's greedy outputs for PROMPTS)."""
    model, folder = tiny_family_model(request.param)
    return request.param, folder, model, [hf_greedy(model, p, MAX_NEW) for p in PROMPTS]


def test_one_at_a_time_and_batched(family, engine_for):
    name, folder, _, want = family
    engine = engine_for(folder, enable_prefix_caching=False)
    assert [greedy(engine, [p])[0] for p in PROMPTS] == want, name
    assert greedy(engine, PROMPTS) == want, name
    assert_no_leak(engine)


def test_chunked_prefill(family, engine_for):
    name, folder, _, want = family
    engine = engine_for(folder, max_num_batched_tokens=7)  # chunks end inside blocks and windows
    assert greedy(engine, PROMPTS) == want, name
    assert_no_leak(engine)


def test_prefix_cached(family, engine_for):
    name, folder, _, want = family
    engine = engine_for(folder)
    assert greedy(engine, PROMPTS[:1]) == want[:1], name
    assert greedy(engine, PROMPTS[3:]) == want[3:], name  # 33 of whose tokens are PROMPTS[0]'s
    assert engine.kv_cache_manager.num_prefix_hits >= 24, name  # 3 of the 4 full shared blocks (or all 4)
    assert_no_leak(engine)


def test_async_scheduling_only_for_one_kv_cache_group(family, engine_for):
    """Asked for async scheduling: Qwen3 and Phi-3 (one KV-cache group; Phi-3's has a window, so blocks are
    handed back while rows of the persistent inputs are written incrementally) overlap their steps; Gemma 2
    and 3 (several groups) step synchronously. Greedy output as HF's either way."""
    name, folder, _, want = family
    engine = engine_for(folder, async_scheduling=True, max_num_batched_tokens=7)
    assert engine.async_scheduling == (len(engine.runner.kv_groups) == 1) == (name in ("qwen3", "phi3")), name
    assert greedy(engine, PROMPTS) == want, name
    assert_no_leak(engine)


def test_gguf_same_weights_same_output(family, write_gguf, tmp_path, engine_for):
    name, _, model, want = family
    path = tmp_path / f"{name}.gguf"
    write_gguf(model, path)
    engine = engine_for(str(path))
    assert engine.runner.arch.family == name
    assert greedy(engine, PROMPTS) == want, name
    assert_no_leak(engine)


def test_gguf_quantized_weights_stay_quantized(family, write_gguf, tmp_path, engine_for):
    """Each family's GGUF with Q8_0 linear layers and embedding (llama.cpp's names, Phi-3's fused qkv and
    gate/up) loads with the weights in their blocks, and greedy output matches the same file dequantized."""
    from modelplex_native_gpu.layers.linear import Linear

    name, _, model, _ = family
    path = tmp_path / f"{name}.q8_0.gguf"
    write_gguf(model, path, quantize="Q8_0")
    quantized = engine_for(str(path), quantized_weights=True)
    linears = [m for m in quantized.runner.model.modules() if isinstance(m, Linear)]
    assert linears and all(m.quantized is not None and m.weight is None for m in linears), name
    dequantized = engine_for(str(path), quantized_weights=False)
    assert not any(getattr(m, "quantized", None) for m in dequantized.runner.model.modules()), name
    assert greedy(quantized, PROMPTS) == greedy(dequantized, PROMPTS), name
    assert_no_leak(quantized)


def test_phi3_short_factors_within_the_original_context(tiny_family_model, hf_greedy, engine_for):
    """max_model_len <= original_max_position_embeddings (32): LongRoPE's short factors, as HF uses for
    sequences that stay within it."""
    model, folder = tiny_family_model("phi3")
    prompts = [[5, 17, 99, 3, 42, 8, 250, 1, 77, 13], [9, 9, 200, 31, 4]]
    engine = engine_for(folder, max_model_len=32)
    assert greedy(engine, prompts) == [hf_greedy(model, p, MAX_NEW) for p in prompts]


def test_gemma2_final_softcap_shapes_the_logprobs(tiny_family_model, engine_for):
    """The final soft-cap is monotonic (greedy cannot see it): the first token's logprobs can."""
    model, folder = tiny_family_model("gemma2")
    with torch.inference_mode():
        want = torch.log_softmax(model(torch.tensor([PROMPTS[1]])).logits[0, -1].float(), -1)
    engine = engine_for(folder)
    [[out]] = engine.generate([PROMPTS[1]], SamplingParams(temperature=0, max_tokens=1, logprobs=5))
    [got] = out.new_logprobs  # max_tokens=1: the final output is the only one
    assert len(got) == 5
    torch.testing.assert_close(torch.tensor(list(got.values())), want[list(got)], rtol=1e-4, atol=1e-4)
