"""Greedy outputs with LoRA adapters are token-identical to transformers + PEFT (fp32, SmolLM2-135M),
for each adapter alone and with four adapters and the base model in one batch, with fewer slots than
adapters (rotation), and with prefix caching keeping adapters apart."""
import pytest
import torch

from modelplex_native_gpu.config import EngineConfig
from modelplex_native_gpu.engine.llm_engine import LLMEngine
from modelplex_native_gpu.engine.sampling_params import SamplingParams

MAX_NEW = 16
QUESTIONS = ["What is the capital of France?", "Write a haiku about autumn leaves."]


@pytest.fixture(scope="module")
def tokenizer(gguf_path):
    from modelplex_native_gpu.loader.tokenizer import load_tokenizer

    return load_tokenizer(gguf_path)


@pytest.fixture(scope="module")
def prompts(tokenizer):
    def ids(question):
        out = tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                            tokenize=True)
        return list(out["input_ids"] if hasattr(out, "keys") else out)

    return [ids(q) for q in QUESTIONS]


def hf_greedy(model, ids):
    with torch.inference_mode():
        out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                             max_new_tokens=MAX_NEW, do_sample=False, pad_token_id=2)
    return out[0, len(ids):].tolist()


@pytest.fixture(scope="module")
def expected(hf_model, adapter_dirs, prompts):
    """(adapter or None, prompt index) -> HF + PEFT greedy tokens (the adapter not merged)."""
    from peft import PeftModel

    want = {(None, i): hf_greedy(hf_model, ids) for i, ids in enumerate(prompts)}
    for name, folder in adapter_dirs.items():
        peft_model = PeftModel.from_pretrained(hf_model, folder)
        want |= {(name, i): hf_greedy(peft_model, ids) for i, ids in enumerate(prompts)}
        peft_model.unload()
    return want


@pytest.fixture(scope="module")
def weights(gguf_path):
    from modelplex_native_gpu.loader import load_weights

    return load_weights(gguf_path)


def make_engine(gguf_path, weights, tokenizer, adapter_dirs, **overrides):
    torch.set_num_threads(2)
    settings = dict(model=gguf_path, device="cpu", dtype="float32", max_model_len=256,
                    kv_cache_memory_bytes=48 << 20, max_loras=4, max_lora_rank=16,
                    adaptive_threads=False)  # a fixed thread count: fp32 sums in a fixed order, as in HF
    engine = LLMEngine(EngineConfig(**settings | overrides), tokenizer=tokenizer, loaded=weights)
    for name, folder in adapter_dirs.items():
        engine.lora.manager.register(name, folder)
    return engine


def greedy(engine, prompts, loras):
    outs = engine.generate(prompts, SamplingParams(temperature=0, max_tokens=MAX_NEW), loras=loras)
    return [o[0].token_ids for o in outs]


def assert_idle(engine):
    kv = engine.kv_cache_manager
    assert not engine.has_unfinished_requests() and kv.block_pool.num_used_blocks == 0
    assert all(a.num_pins == 0 for a in engine.lora.manager.adapters.values())


def test_adapters_change_the_output(expected):
    """Otherwise the parity below would prove nothing."""
    for name in ("tone", "legal", "code", "poet"):
        assert any(expected[(name, i)] != expected[(None, i)] for i in range(len(QUESTIONS))), name


def test_each_adapter_alone_matches_peft(gguf_path, weights, tokenizer, adapter_dirs, prompts, expected):
    engine = make_engine(gguf_path, weights, tokenizer, adapter_dirs, enable_prefix_caching=False)
    for (name, i), want in expected.items():
        assert greedy(engine, [prompts[i]], [name]) == [want], (name, i)
    assert_idle(engine)


def test_four_adapters_and_the_base_model_in_one_batch(gguf_path, weights, tokenizer, adapter_dirs, prompts,
                                                       expected):
    engine = make_engine(gguf_path, weights, tokenizer, adapter_dirs)
    keys = list(expected)
    got = greedy(engine, [prompts[i] for _, i in keys], [name for name, _ in keys])
    assert got == [expected[k] for k in keys]
    assert_idle(engine)


def test_fewer_slots_than_adapters_rotate(gguf_path, weights, tokenizer, adapter_dirs, prompts, expected):
    engine = make_engine(gguf_path, weights, tokenizer, adapter_dirs, max_loras=2, max_num_batched_tokens=64)
    keys = [k for k in expected if k[0] is not None]
    got = greedy(engine, [prompts[i] for _, i in keys], [name for name, _ in keys])
    assert got == [expected[k] for k in keys]
    counters = [a.counters for a in engine.lora.manager.adapters.values()]
    assert sum(c["slot_evictions"] for c in counters) >= 2 and all(c["slot_loads"] >= 1 for c in counters)
    assert_idle(engine)


def test_prefix_cache_never_shares_kv_across_adapters(gguf_path, weights, tokenizer, adapter_dirs, prompts,
                                                      expected):
    engine = make_engine(gguf_path, weights, tokenizer, adapter_dirs)
    kv, seen = engine.kv_cache_manager, set()
    for name in ("tone", None, "legal", "tone"):
        hits_before = kv.num_prefix_hits
        assert greedy(engine, [prompts[0]], [name]) == [expected[(name, 0)]], name
        assert (kv.num_prefix_hits > hits_before) == (name in seen), name  # hits only on its own blocks
        seen.add(name)
    assert_idle(engine)
