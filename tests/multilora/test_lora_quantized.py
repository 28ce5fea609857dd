"""LoRA adapters over bases that stay in their format: GGUF quantized weights kept in their blocks (Q8_0 of
SmolLM2; Q4_0 and K-quants of the tiny random model) and bf16 weights, adapters in the activation precision.

Each adapter over a quantized base gives the output it gives over the same file's dequantized fp32 weights
(the engine's reference path, whose LoRA output equals transformers + PEFT token for token:
test_lora_hf_parity.py), within the quantized linears' own error; in a batch mixing adapters and the base
model each request gets the tokens it gets alone."""
import numpy as np
import pytest
import torch
from helpers.hidden_states import every_row_hidden_states
from helpers.lora import write_random_adapter
from helpers.tiny_gguf import FFN, HEADS, HIDDEN, KV_HEADS, LAYERS, VOCAB, write_tiny

from modelplex_multilora.peft import BaseModelShape
from modelplex_native_gpu.config import EngineConfig
from modelplex_native_gpu.engine.llm_engine import LLMEngine
from modelplex_native_gpu.engine.sampling_params import SamplingParams
from modelplex_native_gpu.loader import gguf_write

MAX_NEW = 16
QUESTIONS = ["What is the capital of France?", "Write a haiku about autumn leaves."]


def make_engine(path, adapters, quantized, dtype="float32", **overrides):
    torch.set_num_threads(2)
    settings = dict(model=path, device="cpu", dtype=dtype, quantized_weights=quantized, max_model_len=256,
                    kv_cache_memory_bytes=48 << 20, max_loras=4, max_lora_rank=16, enable_prefix_caching=False,
                    adaptive_threads=False)
    engine = LLMEngine(EngineConfig(**settings | overrides))
    for name, folder in adapters.items():
        engine.lora.manager.register(name, folder)
    return engine


def all_logits(engine, ids, lora):
    """Teacher-forced fp32 logits at every position of `ids` with adapter `lora` (one prefill step)."""
    model = engine.runner.model
    with every_row_hidden_states(model) as captured:
        engine.generate([ids], SamplingParams(temperature=0, max_tokens=1), loras=[lora])
    with torch.inference_mode():
        return model.compute_logits(captured[0]).float()


def greedy(engine, prompts, loras):
    outs = engine.generate(prompts, SamplingParams(temperature=0, max_tokens=MAX_NEW), loras=loras)
    return [o[0].token_ids for o in outs]


def assert_base_stays_quantized(engine):
    qkv = engine.runner.model.layers[0].self_attn.qkv_proj  # the LoRA wrapper
    assert qkv.base.quantized is not None and qkv.base.weight is None
    assert qkv.lora_a.dtype == engine.runner.dtype  # adapters in the activation precision


# ---- SmolLM2 requantized to Q8_0, the adapters PEFT made (conftest.py) --------------------------------------

@pytest.fixture(scope="module")
def q8_path(gguf_path, tmp_path_factory):
    path = str(tmp_path_factory.mktemp("lora_q8") / "smollm2-Q8_0.gguf")
    gguf_write.requantize(gguf_path, path, "Q8_0")
    return path


@pytest.fixture(scope="module")
def prompts(q8_path):
    from modelplex_native_gpu.loader.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(q8_path)

    def ids(question):
        out = tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                            tokenize=True)
        return list(out["input_ids"] if hasattr(out, "keys") else out)

    return [ids(q) for q in QUESTIONS]


@pytest.fixture(scope="module")
def q8_engines(q8_path, adapter_dirs):
    quantized = make_engine(q8_path, adapter_dirs, True)
    assert_base_stays_quantized(quantized)
    return quantized, make_engine(q8_path, adapter_dirs, False)


@pytest.fixture(scope="module")
def alone(q8_engines, adapter_dirs, prompts):
    """(adapter or None, prompt index) -> greedy tokens of the request alone, on the Q8_0 and the fp32 engine."""
    keys = [(name, i) for name in (None, *adapter_dirs) for i in range(len(prompts))]
    return {key: tuple(greedy(engine, [prompts[key[1]]], [key[0]])[0] for engine in q8_engines) for key in keys}


def test_adapters_over_q8_0_match_the_dequantized_base(q8_engines, alone, prompts):
    """Greedy tokens equal; teacher-forced logits over prompt + answer within 0.2% of their largest magnitude
    (measured: at most 0.05%; the quantized linears' error through one layer is bounded in
    tests/helpers/quant_check.py), while each adapter moves them by over 1%: the parity is the adapter's."""
    quantized, dequantized = q8_engines
    for (name, i), (got, want) in alone.items():
        assert got == want, (name, i)
        ids = prompts[i] + want
        q_logits, d_logits = all_logits(quantized, ids, name), all_logits(dequantized, ids, name)
        scale = d_logits.abs().max().item()
        assert (q_logits - d_logits).abs().max().item() <= 2e-3 * scale, (name, i)
        if name is not None:
            assert (d_logits - all_logits(dequantized, ids, None)).abs().max().item() >= 1e-2 * scale, (name, i)


def test_mixed_batch_over_q8_0_gives_each_request_its_answer_alone(q8_engines, alone, prompts):
    quantized, _ = q8_engines
    keys = list(alone)
    got = greedy(quantized, [prompts[i] for _, i in keys], [name for name, _ in keys])
    assert got == [alone[k][0] for k in keys]


# ---- the tiny random model: Q4_0 and K-quants, and bf16 activations -----------------------------------------

@pytest.fixture(scope="module")
def tiny_adapters(tmp_path_factory):
    shape = BaseModelShape.llama(HIDDEN, FFN, LAYERS, HEADS, KV_HEADS, HIDDEN // HEADS)
    root = tmp_path_factory.mktemp("tiny_adapters")
    return {"attn": write_random_adapter(root / "attn", shape, 8, ["q_proj", "k_proj", "v_proj", "o_proj"], 0,
                                         b_std=0.3),
            "mlp": write_random_adapter(root / "mlp", shape, 4, ["gate_proj", "up_proj", "down_proj"], 1, b_std=0.3)}


TINY_IDS = [int(t) for t in np.random.default_rng(0).integers(3, VOCAB, 40)]


@pytest.mark.parametrize("type_name", ["Q4_0", "Q4_K", "Q6_K"])
def test_adapters_over_4_and_6_bit_bases_match_the_dequantized_base(tmp_path, tiny_adapters, type_name):
    path = write_tiny(tmp_path / f"tiny-{type_name}.gguf", type_name)
    tiny = dict(kv_cache_memory_bytes=16 << 20, skip_tokenizer_init=True, max_lora_rank=8)
    quantized = make_engine(path, tiny_adapters, True, **tiny)
    assert_base_stays_quantized(quantized)
    dequantized = make_engine(path, tiny_adapters, False, **tiny)
    base = all_logits(dequantized, TINY_IDS, None)
    for name in (None, *tiny_adapters):
        got, want = all_logits(quantized, TINY_IDS, name), all_logits(dequantized, TINY_IDS, name)
        scale = want.abs().max().item()
        assert (got - want).abs().max().item() <= 1e-3 * scale, (type_name, name)
        if name is not None:  # the adapter moves the logits far more than the quantized linears' error does
            assert (want - base).abs().max().item() >= 0.02 * scale, (type_name, name)


@pytest.mark.parametrize("quantized", [True, False], ids=["q8_0-base", "bf16-base"])
def test_adapters_in_bf16(tmp_path, tiny_adapters, quantized):
    """bf16 activations and adapters over a Q8_0 base (kept in blocks) or bf16 weights: the adapter's effect
    on the logits is fp32's within bf16's precision, and a mixed prefill gives each request its token alone."""
    path = write_tiny(tmp_path / "tiny-Q8_0.gguf", "Q8_0")
    tiny = dict(kv_cache_memory_bytes=16 << 20, skip_tokenizer_init=True, max_lora_rank=8)
    engine = make_engine(path, tiny_adapters, quantized, dtype="bfloat16", **tiny)
    reference = make_engine(path, tiny_adapters, False, **tiny)
    assert engine.runner.model.layers[0].self_attn.qkv_proj.lora_a.dtype == torch.bfloat16
    if quantized:
        assert_base_stays_quantized(engine)
    else:
        assert engine.runner.model.layers[0].mlp.gate_up_proj.base.weight_tensors()[0].dtype == torch.bfloat16
    base, base_ref = all_logits(engine, TINY_IDS, None), all_logits(reference, TINY_IDS, None)
    for name in tiny_adapters:
        delta = all_logits(engine, TINY_IDS, name) - base
        delta_ref = all_logits(reference, TINY_IDS, name) - base_ref
        cosine = torch.nn.functional.cosine_similarity(delta.flatten(), delta_ref.flatten(), dim=0).item()
        assert cosine >= 0.98, (name, cosine)
    # The first token comes from the prefill step, where all adapters and the base model mix. (Later bf16 decode
    # steps of other batch sizes may round differently in the base model: one request's greedy tokens diverged
    # after 3 tokens while the LoRA ops gave bit-identical rows alone and mixed.)
    prompts = [TINY_IDS[:n] for n in (40, 17, 29)]
    keys = [(lora, i) for lora in (None, *tiny_adapters) for i in range(len(prompts))]
    first = SamplingParams(temperature=0, max_tokens=1)
    each = [engine.generate([prompts[i]], first, loras=[lora])[0][0].token_ids for lora, i in keys]
    mixed = engine.generate([prompts[i] for _, i in keys], first, loras=[lora for lora, _ in keys])
    assert [o[0].token_ids for o in mixed] == each
