"""Greedy output is token-identical to HF transformers `generate` (fp32) in every scheduling situation."""
import pytest
import torch

from modelplex_native_gpu.engine.sampling_params import SamplingParams

MAX_NEW = 20
QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about autumn leaves.",
    "Explain photosynthesis in one sentence.",
    "List three prime numbers.",
    "Translate 'good morning' into Spanish.",
    "What does a CPU do?",
]
RAW_TEXTS = [
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Once upon a time, in a small village by the sea, there lived",
]
SYSTEM = ("You are a careful assistant for a public library. You answer questions about books, opening hours, "
          "membership and events. Keep answers short, friendly and accurate. If you do not know, say so.")


def chat_ids(tokenizer, question, system=None):
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": question}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


@pytest.fixture(scope="module")
def prompts(tokenizer):
    return ([chat_ids(tokenizer, q) for q in QUESTIONS]
            + [tokenizer.encode(t, add_special_tokens=False) for t in RAW_TEXTS])


@pytest.fixture(scope="module")
def hf_model(gguf_path):
    import os

    from transformers import AutoModelForCausalLM

    folder, name = os.path.split(gguf_path)
    return AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()


def hf_greedy(model, ids, max_new=MAX_NEW):
    with torch.inference_mode():
        out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                             max_new_tokens=max_new, do_sample=False, pad_token_id=2)
    return out[0, len(ids):].tolist()


@pytest.fixture(scope="module")
def hf_outputs(hf_model, prompts):
    return [hf_greedy(hf_model, ids) for ids in prompts]


def engine_greedy(engine, prompts, max_new=MAX_NEW):
    params = SamplingParams(temperature=0, max_tokens=max_new)
    return [outs[0].token_ids for outs in engine.generate(prompts, params)]


def assert_no_leak(engine):
    kv = engine.kv_cache_manager
    assert not engine.has_unfinished_requests()
    assert kv.block_pool.num_used_blocks == 0
    assert kv.num_free_blocks + kv.block_pool.num_used_blocks == engine.runner.num_blocks - 1


def test_greedy_matches_hf_one_request_at_a_time(make_engine, prompts, hf_outputs):
    engine = make_engine(enable_prefix_caching=False)
    for ids, want in zip(prompts, hf_outputs):
        assert engine_greedy(engine, [ids]) == [want]
    assert_no_leak(engine)


def test_greedy_matches_hf_batched(make_engine, prompts, hf_outputs):
    engine = make_engine(enable_prefix_caching=False)
    assert engine_greedy(engine, prompts) == hf_outputs
    assert_no_leak(engine)


def test_greedy_matches_hf_with_chunked_prefill(make_engine, prompts, hf_outputs):
    engine = make_engine(max_num_batched_tokens=24)
    assert engine_greedy(engine, prompts) == hf_outputs
    assert_no_leak(engine)


def test_shared_prefix_served_from_prefix_cache(make_engine, tokenizer, hf_model):
    questions = QUESTIONS[:3]
    prompts = [chat_ids(tokenizer, q, SYSTEM) for q in questions]
    want = [hf_greedy(hf_model, ids) for ids in prompts]
    engine = make_engine()
    first = engine_greedy(engine, prompts[:1])
    rest = engine_greedy(engine, prompts[1:])
    assert first + rest == want
    kv = engine.kv_cache_manager
    shared_blocks = len(chat_ids(tokenizer, "", SYSTEM)) // engine.config.block_size - 1
    assert kv.num_prefix_hits >= 2 * shared_blocks * engine.config.block_size
    assert_no_leak(engine)


def test_greedy_matches_hf_with_64_token_blocks(make_engine, tokenizer, hf_model, prompts, hf_outputs):
    """The block size suggested for CPU throughput: batched, chunks of 40 tokens crossing block
    boundaries, and a second request served from a cached 64-token block."""
    engine = make_engine(block_size=64, max_num_batched_tokens=40)
    assert engine_greedy(engine, prompts) == hf_outputs
    long_system = " ".join([SYSTEM] * 2)
    shared = [chat_ids(tokenizer, q, long_system) for q in QUESTIONS[:2]]
    assert len(chat_ids(tokenizer, "", long_system)) > 64
    hits_before = engine.kv_cache_manager.num_prefix_hits
    assert engine_greedy(engine, shared[:1]) + engine_greedy(engine, shared[1:]) == [hf_greedy(hf_model, ids)
                                                                                     for ids in shared]
    assert engine.kv_cache_manager.num_prefix_hits - hits_before >= 64
    assert_no_leak(engine)


def test_greedy_matches_hf_after_forced_preemption(make_engine, prompts, hf_outputs, loaded_weights):
    # Room for 9 usable blocks: four requests of 3-4 blocks cannot all decode at once.
    runner_bytes = 2 * 30 * 16 * 3 * 64 * 4  # bytes per block: K+V, 30 layers, 16 slots, 3 heads, dim 64, fp32
    engine = make_engine(kv_cache_memory_bytes=10 * runner_bytes, max_model_len=128)
    assert engine.runner.bytes_per_block == runner_bytes
    assert engine_greedy(engine, prompts[:4]) == hf_outputs[:4]
    assert engine.scheduler.num_preemptions > 0
    assert_no_leak(engine)
