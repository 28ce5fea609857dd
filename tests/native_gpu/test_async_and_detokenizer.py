"""AsyncLLMEngine streams and incremental detokenization of multi-byte characters."""
import asyncio
import time

import pytest

from modelplex_native_gpu.engine.async_engine import AsyncLLMEngine
from modelplex_native_gpu.engine.detokenizer import IncrementalDetokenizer
from modelplex_native_gpu.engine.sampling_params import SamplingParams
from modelplex_native_gpu.errors import InvalidRequestError

STEP_SECONDS = 0.4
TEXT = "Café au lait, naïve 日本語 and emoji 🙂👍🏽 done."


def test_deltas_never_split_multibyte_characters(tokenizer):
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer, prompt_token_ids=[1, 2, 3])
    deltas = [detok.add_tokens([i]) for i in ids]
    assert "".join(deltas) == TEXT == detok.text
    assert not any("\ufffd" in d for d in deltas)
    assert len(ids) > len([d for d in deltas if d])  # some tokens were held back mid-character


def test_stop_string_spanning_two_deltas_is_cut(tokenizer):
    ids = tokenizer.encode("alpha beta gamma", add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer, [], stop=["ta gam"])
    text = "".join(detok.add_tokens([i]) for i in ids)
    assert text == detok.text == "alpha be" and detok.stopped_by == "ta gam"  # " beta" was held back


@pytest.fixture(scope="module")
def async_engine(make_engine):
    engine = AsyncLLMEngine(make_engine())
    yield engine
    engine.shutdown()


async def collect(engine, request_id, prompt, params):
    return [out async for out in engine.generate(request_id, prompt, params)]


def test_concurrent_streams_deliver_incremental_outputs(async_engine, tokenizer):
    prompts = ["The three primary colors are", "A short poem about the sea:", "def add(a, b):"]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)

    async def main():
        return await asyncio.gather(*(collect(async_engine, f"s{i}", p, params) for i, p in enumerate(prompts)))

    streams = asyncio.run(main())
    for stream in streams:
        final = stream[-1]
        assert final.finished and final.finish_reason == "length" and all(not o.finished for o in stream[:-1])
        assert sum((o.new_token_ids for o in stream), []) == final.token_ids and len(final.token_ids) == 12
        assert "".join(o.text_delta for o in stream) == final.text
        assert final.text == tokenizer.decode(final.token_ids, skip_special_tokens=True)
    assert async_engine.engine.kv_cache_manager.block_pool.num_used_blocks == 0


def test_leaving_a_stream_early_aborts_and_bad_input_raises(async_engine):
    async def main():
        async for out in async_engine.generate("early", "Count to one hundred:", SamplingParams(max_tokens=200)):
            assert not out.finished
            break
        with pytest.raises(InvalidRequestError, match="top_p"):
            await collect(async_engine, "bad", "hi", {"top_p": 2.0})

    asyncio.run(main())
    wait_until(lambda: not async_engine.engine.is_active("early"))  # the abort lands between two steps
    assert async_engine.engine.kv_cache_manager.block_pool.num_used_blocks == 0


def wait_until(condition, timeout: float = 10.0) -> float:
    """Seconds until `condition()` held; fails after `timeout`."""
    start = time.perf_counter()
    while not condition():
        assert time.perf_counter() - start < timeout, "condition never held"
        time.sleep(0.001)
    return time.perf_counter() - start


def test_add_and_abort_never_wait_for_a_step_and_abort_frees_within_one(make_engine):
    """With every step slowed by 0.4 s, adding and aborting still return at once (they only queue),
    and an aborted request's KV blocks are back in the pool at most one step later."""
    engine = make_engine()
    step = engine.step

    step_seconds = []

    def slow_step():
        started = time.perf_counter()
        time.sleep(STEP_SECONDS)
        outputs = step()
        step_seconds.append(time.perf_counter() - started)
        return outputs

    engine.step = slow_step
    async_engine = AsyncLLMEngine(engine)
    pool = engine.kv_cache_manager.block_pool
    params = SamplingParams(max_tokens=500, ignore_eos=True)

    async def main():
        long = async_engine.generate("long", "Count to one hundred:", params)
        await anext(long)  # running; the engine is now always inside a slow step
        started = time.perf_counter()
        short = async_engine.generate("short", "Hi", SamplingParams(max_tokens=2))
        first = asyncio.ensure_future(anext(short))
        await asyncio.sleep(0)  # the add runs here
        add_seconds = time.perf_counter() - started
        started = time.perf_counter()
        await long.aclose()  # aborts
        abort_seconds = time.perf_counter() - started
        freed_after = await asyncio.to_thread(wait_until, lambda: not engine.is_active("long"))
        await first
        await short.aclose()
        return add_seconds, abort_seconds, freed_after

    try:
        add_seconds, abort_seconds, freed_after = asyncio.run(main())
        wait_until(lambda: pool.num_used_blocks == 0)
    finally:
        async_engine.shutdown()
    # Waiting for the step would take >= STEP_SECONDS; the margins allow for a loaded machine.
    assert add_seconds < STEP_SECONDS / 4 and abort_seconds < STEP_SECONDS / 4, (add_seconds, abort_seconds)
    assert freed_after < max(step_seconds) + 0.1, (freed_after, step_seconds)  # the step running at the abort
