"""minilm_ov (the example minilm converted to OpenVINO IR) through both clients: torch's embeddings,
the same answers as the ONNX model, and concurrent requests that each get their own answer."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from helpers.infer_clients import PROTOCOLS, infer, model_config
from helpers.ov_models import tokenize, torch_embeddings
from helpers.serverproc import ServerProcess

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def minilm_server(minilm_both_repo):
    with ServerProcess([minilm_both_repo], env={"HF_HUB_OFFLINE": "1"}) as server:
        yield server


@pytest.fixture(scope="module")
def tokenized(minilm_both_repo, minilm_texts):
    return tokenize(minilm_both_repo, minilm_texts)


@pytest.fixture(scope="module")
def reference(tokenized):
    return torch_embeddings(tokenized)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_embeddings_equal_torch(minilm_server, tokenized, reference, protocol):
    result = infer(minilm_server, protocol, "minilm_ov", tokenized)
    hidden, embeddings = result.as_numpy("last_hidden_state"), result.as_numpy("embeddings")
    ref_hidden, ref_embeddings = reference
    assert embeddings.shape == ref_embeddings.shape and embeddings.dtype == np.float32
    np.testing.assert_allclose(embeddings, ref_embeddings, atol=1e-4, rtol=0)
    real_tokens = tokenized["attention_mask"].astype(bool)  # padded positions are not compared
    np.testing.assert_allclose(hidden[real_tokens], ref_hidden[real_tokens], atol=1e-4, rtol=0)


def test_same_answer_as_the_onnx_model(minilm_server, tokenized):
    onnx = infer(minilm_server, "grpc", "minilm", tokenized, ["embeddings"]).as_numpy("embeddings")
    openvino = infer(minilm_server, "grpc", "minilm_ov", tokenized, ["embeddings"])
    assert openvino.as_numpy("last_hidden_state") is None  # only the output asked for
    np.testing.assert_allclose(openvino.as_numpy("embeddings"), onnx, atol=1e-5, rtol=0)


def test_config_is_the_builders_with_openvino_parameters(minilm_server):
    config = model_config(minilm_server, "http", "minilm_ov")
    assert config["backend"] == "openvino" and not config.get("platform")  # Triton has no platform for it
    assert config["default_model_filename"] == "model.xml" and config["max_batch_size"] == 64
    assert [(t["name"], t["dims"]) for t in config["output"]] == [("last_hidden_state", [-1, 384]),
                                                                  ("embeddings", [384])]
    assert config["parameters"]["INFERENCE_PRECISION_HINT"]["string_value"] == "f32"


def test_concurrent_requests_each_get_their_own_answer(minilm_server, minilm_both_repo):
    """16 clients at once, each a different text: a reused infer request whose outputs were not copied
    out in time would hand one client another's embedding."""
    texts = [f"sentence number {i} is about {word}" for i, word in
             enumerate(["cats", "ships", "rain", "bread", "music", "trees", "glass", "paper"] * 2)]
    singles = [tokenize(minilm_both_repo, [text]) for text in texts]
    expected = [infer(minilm_server, "grpc", "minilm_ov", s, ["embeddings"]).as_numpy("embeddings") for s in singles]
    assert min(np.abs(expected[0] - e).max() for e in expected[1:]) > 1e-3  # the texts are told apart

    def ask(i: int) -> np.ndarray:
        protocol = PROTOCOLS[i % 2]
        return infer(minilm_server, protocol, "minilm_ov", singles[i % len(texts)], ["embeddings"]).as_numpy("embeddings")

    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(ask, range(64)))
    for i, answer in enumerate(answers):
        np.testing.assert_allclose(answer, expected[i % len(texts)], atol=1e-5, rtol=0, err_msg=f"request {i}")
