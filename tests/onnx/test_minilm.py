"""all-MiniLM-L6-v2 as the example builder exports it: the server's embeddings equal torch's."""
from __future__ import annotations

import numpy as np
import pytest
from build_repository import minilm_source
from helpers.infer_clients import PROTOCOLS, infer, model_config
from helpers.serverproc import ServerProcess

pytestmark = pytest.mark.slow

TEXTS = ["A man is eating food.",
         "The quick brown fox jumps over the lazy dog, then naps in the afternoon sun by the river.",
         "ok"]


@pytest.fixture(scope="module")
def minilm_server(minilm_repo):
    with ServerProcess([minilm_repo], env={"HF_HUB_OFFLINE": "1"}) as server:
        yield server


@pytest.fixture(scope="module")
def tokenized(minilm_repo) -> dict[str, np.ndarray]:
    """The texts through the tokenizer saved next to the model (padded to the longest)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(minilm_repo / "minilm" / "1" / "tokenizer")
    encoded = tokenizer(TEXTS, padding=True, return_tensors="np")
    return {"input_ids": encoded["input_ids"].astype(np.int64),
            "attention_mask": encoded["attention_mask"].astype(np.int64)}


@pytest.fixture(scope="module")
def torch_reference(tokenized):
    """(token states, sentence embeddings) from transformers' AutoModel + mean pooling + L2 norm."""
    import torch
    from transformers import AutoModel

    model = AutoModel.from_pretrained(minilm_source()).eval()
    ids, mask = torch.from_numpy(tokenized["input_ids"]), torch.from_numpy(tokenized["attention_mask"])
    with torch.no_grad():
        hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state
    weights = mask.unsqueeze(-1).float()
    pooled = torch.nn.functional.normalize((hidden * weights).sum(1) / weights.sum(1), p=2.0, dim=1)
    return hidden.numpy(), pooled.numpy()


def test_saved_tokenizer_matches_the_source(tokenized):
    from transformers import AutoTokenizer

    source = AutoTokenizer.from_pretrained(minilm_source())(TEXTS, padding=True, return_tensors="np")
    np.testing.assert_array_equal(tokenized["input_ids"], source["input_ids"])


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_embeddings_equal_torch(minilm_server, tokenized, torch_reference, protocol):
    result = infer(minilm_server, protocol, "minilm", tokenized)
    hidden, embeddings = result.as_numpy("last_hidden_state"), result.as_numpy("embeddings")
    ref_hidden, ref_embeddings = torch_reference
    assert embeddings.shape == (len(TEXTS), 384) and embeddings.dtype == np.float32
    np.testing.assert_allclose(embeddings, ref_embeddings, atol=1e-4, rtol=0)
    np.testing.assert_allclose(np.linalg.norm(embeddings, axis=1), 1.0, atol=1e-5)
    real_tokens = tokenized["attention_mask"].astype(bool)  # padded positions are not compared
    np.testing.assert_allclose(hidden[real_tokens], ref_hidden[real_tokens], atol=1e-4, rtol=0)


def test_one_text_alone_gives_the_same_embedding(minilm_server, tokenized, torch_reference):
    """Padding must not leak into the pooled embedding: the last text unpadded gives its batch row."""
    length = int(tokenized["attention_mask"][2].sum())
    alone = {name: array[2:3, :length] for name, array in tokenized.items()}
    embedding = infer(minilm_server, "grpc", "minilm", alone).as_numpy("embeddings")
    np.testing.assert_allclose(embedding[0], torch_reference[1][2], atol=1e-4, rtol=0)


def test_config_is_the_one_written_by_the_builder(minilm_server):
    config = model_config(minilm_server, "http", "minilm")
    assert config["max_batch_size"] == 64
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["input"]] == [
        ("input_ids", "TYPE_INT64", [-1]), ("attention_mask", "TYPE_INT64", [-1])]
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["output"]] == [
        ("last_hidden_state", "TYPE_FP32", [-1, 384]), ("embeddings", "TYPE_FP32", [384])]
