"""Triton's classification extension on a small ONNX classifier the test writes (with a label file),
through tritonclient over HTTP and gRPC: the top k of each batch row as "value:index[:label]"."""
from __future__ import annotations

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from helpers.infer_clients import PROTOCOLS
from helpers.serverproc import ServerProcess
from tritonclient.utils import InferenceServerException

MODULES = {"http": httpclient, "grpc": grpcclient}
LABELS = ["cat", "dog", "", "bird", "fish"]  # class 2 has no label: its strings have none
CONFIG = """\
name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 4
input [ {{ name: "SCORES" data_type: TYPE_FP32 dims: [ 5 ] }} ]
output [ {{ name: "PROBS" data_type: TYPE_FP32 dims: [ 5 ] label_filename: "{labels}" }},
         {{ name: "RANKS" data_type: TYPE_FP32 dims: [ 5 ] }} ]
"""


def classifier():
    """PROBS = SCORES and RANKS = SCORES (two outputs: one with labels, one without)."""
    import onnx
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Identity", ["SCORES"], ["PROBS"]), helper.make_node("Identity", ["SCORES"], ["RANKS"])]
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["b", 5]) for n in ("SCORES", "PROBS", "RANKS")]
    graph = helper.make_graph(nodes, "classifier", io[:1], io[1:])
    return onnx.helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.fixture(scope="module")
def classifier_server(tmp_path_factory):
    import onnx

    repo = tmp_path_factory.mktemp("classification")
    for name, labels in (("classifier", "labels.txt"), ("missing_labels", "absent.txt"),
                         ("escaping_labels", "../classifier/labels.txt")):
        (repo / name / "1").mkdir(parents=True)
        onnx.save(classifier(), repo / name / "1" / "model.onnx")
        (repo / name / "config.pbtxt").write_text(CONFIG.format(name=name, labels=labels))
    (repo / "classifier" / "labels.txt").write_text("\n".join(LABELS) + "\n")
    with ServerProcess([repo], "--model-control-mode", "explicit", "--load-model", "classifier") as s:
        yield s


def classify(server, protocol: str, scores: np.ndarray, counts: dict[str, int]):
    mod = MODULES[protocol]
    client = mod.InferenceServerClient(server.http_url if protocol == "http" else server.grpc_url)
    tensor = mod.InferInput("SCORES", list(scores.shape), "FP32")
    tensor.set_data_from_numpy(scores)
    outputs = [mod.InferRequestedOutput(name, class_count=k) for name, k in counts.items()]
    return client.infer("classifier", [tensor], outputs=outputs)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_top_k_per_batch_row_with_labels(classifier_server, protocol):
    scores = np.array([[0.1, 0.5, 0.9, 0.3, 0.2], [4.0, 1.0, 2.0, 8.0, 4.0]], np.float32)
    result = classify(classifier_server, protocol, scores, {"PROBS": 3, "RANKS": 2})
    probs, ranks = result.as_numpy("PROBS"), result.as_numpy("RANKS")
    assert probs.shape == (2, 3) and ranks.shape == (2, 2)
    assert probs.tolist() == [[b"0.900000:2", b"0.500000:1:dog", b"0.300000:3:bird"],
                              [b"8.000000:3:bird", b"4.000000:0:cat", b"4.000000:4:fish"]]  # a tie keeps index order
    assert ranks.tolist() == [[b"0.900000:2", b"0.500000:1"], [b"8.000000:3", b"4.000000:0"]]
    datatype = (result.get_output("PROBS")["datatype"] if protocol == "http" else result.get_output("PROBS").datatype)
    assert datatype == "BYTES"


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_k_beyond_the_classes_gives_them_all_and_other_outputs_stay_tensors(classifier_server, protocol):
    scores = np.array([[0.1, 0.5, 0.9, 0.3, 0.2]], np.float32)
    result = classify(classifier_server, protocol, scores, {"PROBS": 9, "RANKS": 0})
    assert result.as_numpy("PROBS").shape == (1, 5)
    np.testing.assert_array_equal(result.as_numpy("RANKS"), scores)  # k 0: not classified


def test_shared_memory_and_classification_together_are_refused(classifier_server):
    """(tritonclient refuses this itself; other clients reach the server, which says why.)"""
    body = {"inputs": [{"name": "SCORES", "shape": [1, 5], "datatype": "FP32", "data": [0, 0, 0, 0, 0]}],
            "outputs": [{"name": "PROBS", "parameters": {"classification": 2, "shared_memory_region": "r",
                                                         "shared_memory_byte_size": 20}}]}
    answer = httpx.post(f"http://{classifier_server.http_url}/v2/models/classifier/infer", json=body)
    assert answer.status_code == 400
    assert answer.json() == {"error": "output can't set both 'shared_memory_region' and 'classification'"}


@pytest.mark.parametrize("model, words", [("missing_labels", "label_filename 'absent.txt' cannot be read"),
                                          ("escaping_labels", "outside the model repository")])
def test_a_label_file_that_cannot_be_read_fails_the_load(classifier_server, model, words):
    client = httpclient.InferenceServerClient(classifier_server.http_url)
    with pytest.raises(InferenceServerException, match=f"failed to load '{model}'.*{words}"):
        client.load_model(model)
    assert not client.is_model_ready(model)
