"""/v1/completions parity with vLLM: several prompts (text or token ids) with n per prompt, echo scoring
with max_tokens 0 against transformers, and unknown fields warned about once."""
import httpx
import numpy as np
import pytest
from helpers.openai_compat import TOOLS_MODEL as MODEL

PROMPTS = ["The capital of France is", "One, two, three,", "The color of the sky is"]


def greedy(client, prompt, max_tokens=5):
    return client.completions.create(model=MODEL, prompt=prompt, max_tokens=max_tokens, temperature=0).choices[0].text


def test_three_prompts_with_n_2_are_indexed_prompt_major(client):
    answer = client.completions.create(model=MODEL, prompt=PROMPTS, n=2, max_tokens=5, temperature=0)
    assert [c.index for c in answer.choices] == list(range(6))
    singles = [greedy(client, p) for p in PROMPTS]
    assert [c.text for c in answer.choices] == [s for s in singles for _ in range(2)]
    assert answer.usage.completion_tokens == 6 * 5
    streamed = list(client.completions.create(model=MODEL, prompt=PROMPTS, n=2, max_tokens=5, temperature=0,
                                              stream=True, stream_options={"include_usage": True}))
    texts = ["".join(c.choices[0].text for c in streamed if c.choices and c.choices[0].index == i) for i in range(6)]
    assert texts == [c.text for c in answer.choices]
    assert streamed[-1].usage.prompt_tokens == answer.usage.prompt_tokens


def test_token_id_prompts_equal_their_text(client, hf_tokenizer):
    ids = [hf_tokenizer.encode(p, add_special_tokens=False) for p in PROMPTS[:2]]
    one = client.completions.create(model=MODEL, prompt=ids[0], max_tokens=5, temperature=0)
    assert one.choices[0].text == greedy(client, PROMPTS[0]) and one.usage.prompt_tokens == len(ids[0])
    two = client.completions.create(model=MODEL, prompt=ids, max_tokens=5, temperature=0, echo=True)
    assert [c.text for c in two.choices] == [p + greedy(client, p) for p in PROMPTS[:2]]


@pytest.fixture(scope="module")
def hf_model(compat_repo):
    import torch
    from transformers import AutoModelForCausalLM

    folder = compat_repo / MODEL / "1"
    return AutoModelForCausalLM.from_pretrained(folder, gguf_file="model.gguf", dtype=torch.float32).eval()


def test_echo_with_max_tokens_0_scores_the_prompt_as_transformers(client, hf_model, hf_tokenizer):
    import torch

    prompt = "The quick brown fox jumps over the lazy dog because it"
    answer = client.completions.create(model=MODEL, prompt=prompt, max_tokens=0, echo=True, logprobs=1)
    choice = answer.choices[0]
    ids = hf_tokenizer.encode(prompt, add_special_tokens=False)
    assert choice.text == prompt and choice.finish_reason == "length"
    assert answer.usage.completion_tokens == 0 and answer.usage.prompt_tokens == len(ids)
    assert choice.logprobs.tokens == [hf_tokenizer.decode([t]) for t in ids]
    assert choice.logprobs.token_logprobs[0] is None and choice.logprobs.top_logprobs[0] is None
    with torch.no_grad():
        logits = hf_model(torch.tensor([ids])).logits[0].float()
    expected = torch.log_softmax(logits, -1)[torch.arange(len(ids) - 1), torch.tensor(ids[1:])].numpy()
    np.testing.assert_allclose(choice.logprobs.token_logprobs[1:], expected, atol=1e-4, rtol=0)
    assert choice.logprobs.text_offset[1] == len(choice.logprobs.tokens[0])


def test_unknown_fields_are_warned_once(client, compat_server):
    for _ in range(2):
        answer = client.completions.create(model=MODEL, prompt="Hi", max_tokens=2,
                                           extra_body={"frobnicate": True, "stream_options_x": 1})
        assert answer.choices[0].text
    log = compat_server.log()
    assert log.count("unknown request field 'frobnicate'") == 1
    assert log.count("unknown request field 'stream_options_x'") == 1


def test_strict_fields_refuse_them():
    """The policy the server builds with --openai-strict-fields (ServerConfig.openai_strict_fields)."""
    from modelplex.openai.errors import RequestError
    from modelplex.openai.fields import FieldPolicy
    from modelplex.openai.schemas import CompletionRequest

    body = CompletionRequest.model_validate({"model": "m", "prompt": "p", "stream_options": {"include_usag": 1}})
    with pytest.raises(RequestError) as error:
        FieldPolicy(strict=True).check(body, "/v1/completions")
    assert error.value.param == "stream_options.include_usag"
    FieldPolicy(strict=False).check(body, "/v1/completions")  # warned, not refused


@pytest.mark.parametrize("fields, param", [
    ({"prompt": []}, "prompt"),
    ({"prompt": [[]]}, "prompt"),
    ({"prompt": [-1]}, "prompt"),
    ({"prompt": [10 ** 9]}, "prompt"),
    ({"max_tokens": 0}, "max_tokens"),  # without echo
    ({"use_beam_search": True}, "use_beam_search"),
    ({"suffix": "x"}, "suffix"),
])
def test_bad_prompts_name_the_field(base_url, fields, param):
    answer = httpx.post(f"{base_url}/v1/completions", json={"model": MODEL, "prompt": "Hi", **fields})
    assert answer.status_code == 400 and answer.json()["error"]["param"] == param, answer.text
