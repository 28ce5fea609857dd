"""Triton's generate extension over httpx, and the decoupled LLM over gRPC ModelStreamInfer with tritonclient."""
import json
import queue

import httpx
import numpy as np
import pytest
from helpers.llm_serving import MODEL, grpc_inputs

PROMPT = "The capital of France is"
GREEDY = {"max_tokens": 8, "temperature": 0}


def sse_data(response: httpx.Response) -> list[dict]:
    assert response.headers["content-type"].startswith("text/event-stream")
    return [json.loads(line[len("data: "):]) for line in response.iter_lines() if line.startswith("data: ")]


def test_generate_takes_top_level_sampling_fields(base_url, idle_engine):
    answer = httpx.post(f"{base_url}/v2/models/{MODEL}/generate", json={"text_input": PROMPT, **GREEDY}).json()
    assert answer["model_name"] == MODEL and answer["model_version"] == "1"
    assert answer["text_output"].startswith(" Paris")
    assert answer["finish_reason"] == "length" and answer["num_output_tokens"] == 8 and answer["num_input_tokens"] == 5


def test_generate_parameters_and_sampling_parameters_agree(base_url):
    url = f"{base_url}/v2/models/{MODEL}/versions/1/generate"
    top_level = httpx.post(url, json={"text_input": PROMPT, **GREEDY}).json()["text_output"]
    in_parameters = httpx.post(url, json={"text_input": PROMPT, "parameters": GREEDY}).json()["text_output"]
    # Triton's vLLM examples send the sampling_parameters input as JSON with numbers as strings.
    as_input = httpx.post(url, json={"text_input": PROMPT, "sampling_parameters": {"max_tokens": "8",
                                                                                  "temperature": "0"}})
    assert top_level == in_parameters == as_input.json()["text_output"]


def test_generate_stream_sends_deltas(base_url, idle_engine):
    whole = httpx.post(f"{base_url}/v2/models/{MODEL}/generate", json={"text_input": PROMPT, **GREEDY}).json()
    with httpx.stream("POST", f"{base_url}/v2/models/{MODEL}/generate_stream",
                      json={"text_input": PROMPT, **GREEDY}) as response:
        assert response.status_code == 200
        events = sse_data(response)
    assert len(events) > 3 and "".join(e["text_output"] for e in events) == whole["text_output"]
    assert [e.get("finish_reason") for e in events] == [None] * (len(events) - 1) + ["length"]


def test_generate_errors(base_url):
    missing = httpx.post(f"{base_url}/v2/models/nope/generate", json={"text_input": PROMPT})
    assert missing.status_code == 404 and "nope" in missing.json()["error"]
    bad = httpx.post(f"{base_url}/v2/models/{MODEL}/generate", json={"text_input": PROMPT, "top_p": 0})
    assert bad.status_code == 400 and bad.json()["error"].startswith("top_p")
    with httpx.stream("POST", f"{base_url}/v2/models/{MODEL}/generate_stream",
                      json={"text_input": PROMPT, "temperature": -1}) as response:
        assert response.status_code == 400 and "temperature" in json.loads(response.read())["error"]


def test_http_infer_on_the_decoupled_llm_points_to_streaming(llm_server):
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    text = httpclient.InferInput("text_input", [1], "BYTES")
    text.set_data_from_numpy(np.array([PROMPT.encode()], dtype=np.object_))
    with pytest.raises(InferenceServerException, match="decoupled"):
        httpclient.InferenceServerClient(llm_server.http_url).infer(MODEL, [text])


def test_grpc_stream_infer_with_tritonclient(llm_server, base_url, idle_engine):
    import tritonclient.grpc as grpcclient

    whole = httpx.post(f"{base_url}/v2/models/{MODEL}/generate", json={"text_input": PROMPT, **GREEDY}).json()
    results = queue.Queue()
    client = grpcclient.InferenceServerClient(llm_server.grpc_url)
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        client.async_stream_infer(MODEL, grpc_inputs(PROMPT, GREEDY), request_id="q1",
                                  enable_empty_final_response=True)
        responses = []
        while True:
            result, error = results.get(timeout=60)
            assert error is None, error
            response = result.get_response()
            responses.append(response)
            if response.parameters["triton_final_response"].bool_param:
                break
    finally:
        client.stop_stream()
    *deltas, final = responses
    assert final.outputs == [] and final.id == "q1"  # Triton's empty final response
    text = "".join(grpcclient.InferResult(r).as_numpy("text_output")[0].decode() for r in deltas)
    assert text == whole["text_output"] and len(deltas) > 3
    assert deltas[-1].parameters["finish_reason"].string_param == "length"
    assert not any(r.parameters["triton_final_response"].bool_param for r in deltas)
