"""xgrammar masks in the sampler: only constrained rows are masked (batched), matchers advance, bad
schemas are typed errors naming response_format, and a bad schema leaves the engine unchanged."""
import pytest
import torch

from modelplex_native_gpu.engine.request import EngineRequest
from modelplex_native_gpu.engine.sampling_params import SamplingParams
from modelplex_native_gpu.engine.structured_output import StructuredOutputs, accept_tokens, apply_grammar_masks
from modelplex_native_gpu.errors import InvalidRequestError

VOCAB = 49152


@pytest.fixture(scope="module")
def outputs(tokenizer):
    return StructuredOutputs(tokenizer, VOCAB, [2])


def test_only_constrained_rows_are_masked(outputs, tokenizer):
    grammar = outputs.compile({"type": "json_object"})
    requests = [EngineRequest(str(i), [1, 2, 3], SamplingParams()) for i in range(4)]
    for i in (1, 3):
        requests[i].grammar = StructuredOutputs.matcher(grammar)
    logits = torch.randn(4, VOCAB)
    before = logits.clone()
    apply_grammar_masks(logits, requests)
    torch.testing.assert_close(logits[[0, 2]], before[[0, 2]], rtol=0, atol=0, msg="an unconstrained row changed")
    for i in (1, 3):
        allowed = torch.isfinite(logits[i]).nonzero().flatten().tolist()
        texts = {tokenizer.decode([t]) for t in allowed}
        assert 0 < len(allowed) < 1000 and all(t.lstrip().startswith("{") for t in texts), sorted(texts)[:20]
    brace = tokenizer.encode("{", add_special_tokens=False)[0]
    accept_tokens(requests, [5, brace, 5, brace])
    logits = torch.randn(4, VOCAB)
    apply_grammar_masks(logits, requests)
    assert not torch.isfinite(logits[1, brace])  # after "{" a key or "}" follows, not another "{"


@pytest.mark.parametrize("response_format, match", [
    ({"type": "yaml"}, "type"),
    ({"type": "json_schema", "json_schema": {"name": "x"}}, "json_schema.schema"),
    ({"type": "json_schema", "json_schema": {"schema": {"type": "nonsense"}}}, "nonsense"),
])
def test_bad_response_formats_name_the_field(outputs, response_format, match):
    with pytest.raises(InvalidRequestError, match=match) as error:
        outputs.compile(SamplingParams(response_format=response_format).response_format)
    assert error.value.field == "response_format"


def test_a_bad_schema_adds_nothing_to_the_engine(make_engine):
    engine = make_engine()
    bad = SamplingParams(response_format={"type": "json_schema", "json_schema": {"schema": {"type": "nonsense"}}})
    with pytest.raises(InvalidRequestError, match="response_format"):
        engine.add_request("bad", "Hi", bad)
    assert not engine.is_active("bad") and not engine.has_unfinished_requests()
