"""A Triton vLLM-backend folder served unchanged (config.pbtxt: `backend: "vllm"` only; `1/model.json`):
auto-completed tensors and decoupled policy, engine arguments applied, the generate extension's vLLM
flags, and the OpenAI routes."""
import httpx
import tritonclient.grpc as grpcclient
from helpers.openai_compat import ENGINE_ARGS
from helpers.openai_compat import VLLM_MODEL as MODEL

PROMPT = "The capital of France is"
SAMPLING = '{"max_tokens": 4, "temperature": 0}'


def test_config_is_completed_as_the_vllm_backend_does(base_url, compat_server):
    config = httpx.get(f"{base_url}/v2/models/{MODEL}/config").json()
    assert config["model_transaction_policy"] == {"decoupled": True} and config["backend"] == "vllm"
    inputs = {t["name"] for t in config["input"]}
    assert {"text_input", "stream", "sampling_parameters", "exclude_input_in_output", "return_finish_reason",
            "return_num_input_tokens", "return_num_output_tokens", "return_cumulative_logprob"} <= inputs
    outputs = {t["name"] for t in config["output"]}
    assert {"text_output", "finish_reason", "num_input_tokens", "num_output_tokens", "cumulative_logprob"} <= outputs
    stats = httpx.get(f"{base_url}/v2/models/{MODEL}/engine_stats").json()["instances"][0]
    assert stats["max_model_len"] == ENGINE_ARGS["max_model_len"]
    assert "ignoring the vLLM engine argument 'swap_space'" in compat_server.log()


def test_generate_prepends_the_prompt_unless_excluded(base_url):
    whole = httpx.post(f"{base_url}/v2/models/{MODEL}/generate", timeout=60, json={
        "text_input": PROMPT, "sampling_parameters": SAMPLING, "return_finish_reason": True,
        "return_num_input_tokens": True, "return_num_output_tokens": True, "return_cumulative_logprob": True}).json()
    assert whole["text_output"].startswith(PROMPT + " Paris")
    assert (whole["finish_reason"], whole["num_input_tokens"], whole["num_output_tokens"]) == ("length", 5, 4)
    assert whole["cumulative_logprob"] < 0 and "logprobs" not in whole
    excluded = httpx.post(f"{base_url}/v2/models/{MODEL}/generate", timeout=60, json={
        "text_input": PROMPT, "sampling_parameters": SAMPLING, "exclude_input_in_output": True}).json()
    assert PROMPT + excluded["text_output"] == whole["text_output"]


def test_streaming_counts_tokens_per_response(compat_server):
    client = grpcclient.InferenceServerClient(compat_server.grpc_url)
    results = []
    client.start_stream(callback=lambda result, error: results.append(error or result))
    inputs = [grpcclient.InferInput("text_input", [1], "BYTES"), grpcclient.InferInput("stream", [1], "BOOL"),
              grpcclient.InferInput("sampling_parameters", [1], "BYTES"),
              grpcclient.InferInput("return_num_output_tokens", [1], "BOOL")]
    import numpy as np

    for tensor, value in zip(inputs, ([PROMPT.encode()], [True], [SAMPLING.encode()], [True])):
        tensor.set_data_from_numpy(np.array(value, dtype=np.object_ if isinstance(value[0], bytes) else bool))
    client.async_stream_infer(MODEL, inputs, enable_empty_final_response=True)
    client.stop_stream()
    texts = [r.as_numpy("text_output") for r in results if r.as_numpy("text_output") is not None]
    counts = [int(r.as_numpy("num_output_tokens")[0]) for r in results if r.as_numpy("num_output_tokens") is not None]
    assert b"".join(t[0] for t in texts).startswith(b" Paris") and sum(counts) == 4 and len(counts) >= 2


def test_unknown_lora_name_is_a_400(base_url):
    answer = httpx.post(f"{base_url}/v2/models/{MODEL}/generate", json={
        "text_input": PROMPT, "sampling_parameters": '{"lora_name": "nope"}'})
    assert answer.status_code == 400 and "nope" in answer.json()["error"]


def test_openai_routes_serve_it(client):
    answer = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "What is the capital "
                                                                    "of France?"}], max_tokens=12, temperature=0)
    assert "Paris" in answer.choices[0].message.content and not answer.choices[0].message.content.startswith("<")
    streamed = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in streamed) == " Paris.\n\n" and len(streamed) >= 3
