"""Triton's `simple` and `simple_string` example models served by the ONNX backend, through both clients."""
from __future__ import annotations

import numpy as np
import pytest
from helpers.infer_clients import PROTOCOLS, client, infer
from tritonclient.utils import InferenceServerException


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("batch", [1, 8])
def test_simple_sums_and_differences(server, protocol, batch):
    rng = np.random.default_rng(batch)
    a = rng.integers(-1000, 1000, (batch, 16), dtype=np.int32)
    b = rng.integers(-1000, 1000, (batch, 16), dtype=np.int32)
    result = infer(server, protocol, "simple", {"INPUT0": a, "INPUT1": b})
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    assert result.as_numpy("OUTPUT0").dtype == np.int32


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_simple_string_sums_decimal_strings(server, protocol):
    a = np.arange(32, dtype=np.int32).reshape(2, 16) * 7
    b = np.full((2, 16), -3, dtype=np.int32)
    as_bytes = np.vectorize(lambda v: str(v).encode(), otypes=[np.object_])
    result = infer(server, protocol, "simple_string", {"INPUT0": as_bytes(a), "INPUT1": as_bytes(b)})
    assert result.as_numpy("OUTPUT0").tolist() == as_bytes(a + b).tolist()
    assert result.as_numpy("OUTPUT1").tolist() == as_bytes(a - b).tolist()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_only_the_requested_output_comes_back(server, protocol):
    a = np.ones((1, 16), dtype=np.int32)
    result = infer(server, protocol, "simple", {"INPUT0": a * 5, "INPUT1": a}, outputs=["OUTPUT1"])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a * 4)
    assert result.as_numpy("OUTPUT0") is None


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_bad_strings_fail_clearly_and_the_model_keeps_serving(server, protocol):
    digits = np.array([[b"1"] * 16], dtype=np.object_)
    not_a_number = digits.copy()
    not_a_number[0, 3] = b"abc"
    with pytest.raises(InferenceServerException, match="onnxruntime failed.*Cast"):
        infer(server, protocol, "simple_string", {"INPUT0": not_a_number, "INPUT1": digits})
    not_utf8 = digits.copy()
    not_utf8[0, 0] = b"\xff\xfe"
    with pytest.raises(InferenceServerException, match="UTF-8"):
        infer(server, protocol, "simple_string", {"INPUT0": not_utf8, "INPUT1": digits})
    result = infer(server, protocol, "simple_string", {"INPUT0": digits, "INPUT1": digits})
    assert result.as_numpy("OUTPUT0").tolist() == [[b"2"] * 16]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_batch_over_max_batch_size_is_refused(server, protocol):
    a = np.zeros((9, 16), dtype=np.int32)
    with pytest.raises(InferenceServerException, match="max_batch_size 8"):
        infer(server, protocol, "simple", {"INPUT0": a, "INPUT1": a})


def test_metadata_describes_the_onnx_model(server):
    metadata = client(server, "http").get_model_metadata("simple")
    assert metadata["platform"] == "onnxruntime_onnx"
    assert [(t["name"], t["datatype"], t["shape"]) for t in metadata["inputs"]] == [
        ("INPUT0", "INT32", [-1, 16]), ("INPUT1", "INT32", [-1, 16])]
    string_metadata = client(server, "grpc").get_model_metadata("simple_string", as_json=True)
    assert [t["datatype"] for t in string_metadata["outputs"]] == ["BYTES", "BYTES"]
