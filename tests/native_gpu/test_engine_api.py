"""LLMEngine behaviour on the real model: stops, n>1, seeds, abort, typed input errors, config errors."""
import pytest

from modelplex_native_gpu.config import EngineConfig
from modelplex_native_gpu.engine.llm_engine import LLMEngine
from modelplex_native_gpu.engine.sampling_params import SamplingParams
from modelplex_native_gpu.errors import InvalidConfigError, InvalidRequestError


@pytest.fixture(scope="module")
def engine(make_engine):
    return make_engine()


@pytest.fixture(scope="module")
def france(tokenizer):
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                        add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def run(engine, prompt, **params):
    (outs,) = engine.generate([prompt], SamplingParams(**params))
    return outs


def assert_no_leak(engine):
    kv = engine.kv_cache_manager
    assert not engine.has_unfinished_requests()
    assert kv.block_pool.num_used_blocks == 0
    assert kv.num_free_blocks + kv.block_pool.num_used_blocks == engine.runner.num_blocks - 1


def test_greedy_answer_then_eos(engine, france):
    (out,) = run(engine, france, temperature=0, max_tokens=24)
    assert out.text == "The capital of France is Paris." and out.finish_reason == "stop"
    assert out.num_prompt_tokens == len(france) and out.num_generated_tokens == len(out.token_ids) == 8
    assert_no_leak(engine)


def test_stop_string_truncates_text(engine, france):
    (out,) = run(engine, france, temperature=0, max_tokens=24, stop=[" Paris"])
    assert out.text == "The capital of France is" and out.finish_reason == "stop" and out.stop_reason == " Paris"
    assert_no_leak(engine)


def test_stop_token_ids_max_tokens_and_ignore_eos(engine, france, tokenizer):
    paris = tokenizer.encode(" Paris", add_special_tokens=False)[0]
    (out,) = run(engine, france, temperature=0, max_tokens=24, stop_token_ids=[paris])
    assert out.token_ids[-1] == paris and out.stop_reason == paris
    (out,) = run(engine, france, temperature=0, max_tokens=3)
    assert len(out.token_ids) == 3 and out.finish_reason == "length"
    (out,) = run(engine, france, temperature=0, max_tokens=12, ignore_eos=True)
    assert len(out.token_ids) == 12 and out.token_ids[7] == 2
    assert_no_leak(engine)


def test_reset_prefix_cache_forgets_cached_blocks_only_while_no_block_is_used(make_engine, france):
    engine = make_engine()
    kv = engine.kv_cache_manager
    run(engine, france, temperature=0, max_tokens=2)
    engine.add_request("busy", france, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    engine.step()
    cached = dict(kv.block_pool.cached_blocks)
    assert cached and not engine.reset_prefix_cache() and kv.block_pool.cached_blocks == cached
    while engine.has_unfinished_requests():
        engine.step()
    hits = kv.num_prefix_hits
    assert hits > 0 and engine.reset_prefix_cache() and not kv.block_pool.cached_blocks
    run(engine, france, temperature=0, max_tokens=2)
    assert kv.num_prefix_hits == hits  # nothing served from the forgotten blocks
    assert_no_leak(engine)


def test_n_completions_share_prompt_blocks_and_seed_reproduces(engine, france):
    hits_before = engine.kv_cache_manager.num_prefix_hits
    outs = run(engine, france, n=3, temperature=1.0, seed=11, max_tokens=10)
    assert [o.index for o in outs] == [0, 1, 2]
    assert engine.kv_cache_manager.num_prefix_hits > hits_before  # siblings reuse the prompt's full blocks
    again = run(engine, france, n=3, temperature=1.0, seed=11, max_tokens=10)
    assert [o.token_ids for o in outs] == [o.token_ids for o in again]
    assert len({tuple(o.token_ids) for o in outs}) > 1
    assert_no_leak(engine)


def test_seeded_output_survives_batching_and_preemption(make_engine, france, engine):
    params = dict(temperature=0.8, top_p=0.9, seed=3, max_tokens=16, ignore_eos=True)
    (alone,) = run(engine, france, **params)
    bytes_per_block = engine.runner.bytes_per_block
    # 6 usable blocks: two 37-token prompts fit (3 blocks each), growing past 48 tokens forces preemption.
    tight = make_engine(kv_cache_memory_bytes=7 * bytes_per_block, max_model_len=64, enable_prefix_caching=False)
    tight.add_request("seeded", france, SamplingParams(**params))
    for i in range(3):
        tight.add_request(f"other{i}", france, SamplingParams(temperature=1.0, max_tokens=16, ignore_eos=True))
    final = {}
    while tight.has_unfinished_requests():
        final.update({o.request_id: o for o in tight.step() if o.finished})
    assert tight.scheduler.num_preemptions > 0
    assert final["seeded"].token_ids == alone.token_ids
    assert_no_leak(tight)


def test_abort_frees_blocks_at_once(engine, france):
    engine.add_request("to-abort", france, SamplingParams(max_tokens=50))
    engine.step()
    assert engine.kv_cache_manager.block_pool.num_used_blocks > 0
    engine.abort("to-abort")
    assert_no_leak(engine)


@pytest.mark.parametrize("prompt_len, params, field", [
    (600, {}, "prompt"),
    (500, {"max_tokens": 20}, "max_tokens"),
    (5, {"temperature": -0.5}, "temperature"),
    (5, {"top_p": 0.0}, "top_p"),
    (5, {"top_p": 1.5}, "top_p"),
    (5, {"max_tokens": 0}, "max_tokens"),
    (5, {"beam_width": 4}, "beam_width"),
])
def test_bad_input_raises_typed_error_naming_the_field(engine, prompt_len, params, field):
    with pytest.raises(InvalidRequestError) as info:
        engine.add_request("bad", [5] * prompt_len, params)
    assert info.value.field == field and field in str(info.value)
    assert_no_leak(engine)


def test_bad_prompt_and_duplicate_id(engine):
    for prompt in ([], [10**9], None):
        with pytest.raises(InvalidRequestError, match="prompt"):
            engine.add_request("bad", prompt)
    engine.add_request("dup", [5, 6], SamplingParams(max_tokens=2))
    with pytest.raises(InvalidRequestError, match="request_id"):
        engine.add_request("dup", [5, 6])
    engine.abort("dup")
    assert_no_leak(engine)


def test_kv_budget_too_small_for_one_sequence_fails_with_needed_bytes(gguf_path, loaded_weights, tokenizer):
    config = EngineConfig(model=gguf_path, device="cpu", dtype="float32", max_model_len=512,
                          kv_cache_memory_bytes=1 << 20)
    with pytest.raises(InvalidConfigError, match=r"kv_cache_memory_bytes.*needs 33 blocks: at least 24330240 bytes"):
        LLMEngine(config, tokenizer=tokenizer, loaded=loaded_weights)


def test_config_rejects_bad_values():
    with pytest.raises(InvalidConfigError, match="block_size"):
        EngineConfig(model="x", block_size=0)
    with pytest.raises(InvalidConfigError, match="dtype"):
        EngineConfig(model="x", dtype="int3")


def test_packed_cpu_weights_are_held_once(engine, france):
    """On CPU fp32 each linear keeps only its packed weight (our panels); the tied LM head leaves the
    embedding (which lookups read) in place. The engine still answers; weight_bytes counts each
    tensor a decode step reads once (SmolLM2-135M: 538 MB in fp32)."""
    from modelplex_native_gpu.layers.linear import Linear

    model = engine.runner.model
    linears = [m for m in model.modules() if isinstance(m, Linear)]
    assert all(m.packed_weight is not None and m.cpu_linear is not None for m in linears)
    assert [m for m in linears if m.weight is not None] == [model.lm_head]
    assert model.lm_head.weight is model.embed_tokens
    assert 535e6 < engine.runner.weight_bytes < 541e6
    (out,) = run(engine, france, temperature=0, max_tokens=24)
    assert out.text == "The capital of France is Paris."
