"""The engine in a process of its own (EngineProcessClient) on a tiny random model, beside the thread mode:
the same tokens, typed errors across the pipe, stats after an abort, a killed process failing its stream
and reporting why, and close ending a process stuck inside one request's add."""
import asyncio
import os
import signal
import time

import pytest
from helpers.tiny_gguf import write_tiny


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    return write_tiny(tmp_path_factory.mktemp("tiny") / "tiny.gguf", "Q8_0")


def start(tiny: str, engine_process: bool = True, **kwargs):
    from modelplex_native_gpu.config import EngineConfig
    from modelplex_native_gpu.engine.launch import start_engine

    config = EngineConfig(model=tiny, device="cpu", dtype="float32", max_model_len=256, num_threads=1,
                          kv_cache_memory_bytes=8 << 20, skip_tokenizer_init=True, engine_process=engine_process)
    return start_engine(config, **kwargs)


def greedy(max_tokens: int, **kwargs):
    from modelplex_native_gpu.engine.sampling_params import SamplingParams

    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, **kwargs)


def test_both_modes_give_the_same_tokens_and_refuse_alike(tiny):
    from modelplex_native_gpu.errors import InvalidRequestError

    async def run(engine_process: bool):
        engine = start(tiny, engine_process)
        try:
            outputs = [o async for o in engine.generate("a", [5, 6, 7], greedy(12, n=2, seed=1))]
            with pytest.raises(InvalidRequestError) as refused:
                async for _ in engine.generate("b", [5] * 10, greedy(250)):
                    pass
            return ({o.index: o.token_ids for o in outputs if o.finished}, refused.value.field,
                    engine.stats()["num_free_blocks"], engine.pid)
        finally:
            await engine.close()

    in_process, in_thread = asyncio.run(run(True)), asyncio.run(run(False))
    assert in_process[:3] == in_thread[:3] and len(in_process[0][0]) == 12 and in_process[1] == "max_tokens"
    assert in_process[3] not in (None, os.getpid()) and in_thread[3] is None


def test_a_killed_process_fails_its_stream_and_reports_why(tiny):
    from modelplex_native_gpu.errors import EngineDeadError

    reasons = []

    async def run():
        engine = start(tiny, on_failure=reasons.append)
        try:
            stream = engine.generate("long", [5, 6], greedy(240))
            first = await anext(stream)
            assert first.new_token_ids and engine.stats()["num_running"] == 1
            os.kill(engine.pid, signal.SIGKILL)
            with pytest.raises(EngineDeadError, match="was killed by SIGKILL"):
                async for _ in stream:
                    pass
            with pytest.raises(EngineDeadError):  # and every later request
                await anext(engine.generate("after", [5], greedy(2)))
        finally:
            await engine.close()

    asyncio.run(run())
    assert len(reasons) == 1 and "was killed by SIGKILL" in reasons[0], reasons


def test_an_abort_frees_the_blocks_and_close_ends_a_process_stuck_in_a_step(tiny):
    from modelplex_native_gpu.engine.core_client import STOP_TIMEOUT_S

    async def run():
        engine = start(tiny)
        idle = engine.stats()["num_free_blocks"]
        stream = engine.generate("long", [5] * 40, greedy(200))
        await anext(stream)
        assert engine.stats()["num_free_blocks"] < idle
        await stream.aclose()  # leaving the stream aborts the request
        for _ in range(100):
            await asyncio.sleep(0.05)
            if engine.stats()["num_free_blocks"] == idle:
                break
        assert engine.stats()["num_free_blocks"] == idle and engine.stats()["num_running"] == 0

        # n=50000 keeps the engine inside one add for minutes (the engine has no cap; the doors do)
        stuck = asyncio.ensure_future(anext(engine.generate("huge", [5], greedy(1, n=50000))))
        await asyncio.sleep(1.0)
        started = time.monotonic()
        await engine.close()
        took = time.monotonic() - started
        assert STOP_TIMEOUT_S - 0.5 < took < STOP_TIMEOUT_S + 3, took
        assert engine.proc.exitcode == -signal.SIGKILL
        with pytest.raises(RuntimeError, match="shut down"):
            await stuck

    asyncio.run(run())
