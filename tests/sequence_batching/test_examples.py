"""The stateful examples of examples/sequence_models.py answer as NVIDIA's sequence clients expect."""
from __future__ import annotations

import queue

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient


def _output(client, module, model: str, value: int, **sequence) -> int:
    tensor = module.InferInput("INPUT", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.full((1, 1), value, np.int32))
    result = client.infer(model, [tensor], **sequence)
    return int(result.as_numpy("OUTPUT")[0, 0])


def _sequence(client, module, model: str, corrid, values: list[int]) -> list[int]:
    return [_output(client, module, model, v, sequence_id=corrid, sequence_start=i == 0,
                    sequence_end=i == len(values) - 1) for i, v in enumerate(values)]


def test_simple_sequence_is_tritons_onnx_example(sequence_server):
    """Triton's config verbatim (START/READY declared only in sequence_batching) loads on ONNX Runtime;
    OUTPUT = INPUT + START, what simple_*_sequence_*_client.py check."""
    client = httpclient.InferenceServerClient(sequence_server.http_url)
    assert _sequence(client, httpclient, "simple_sequence", 1000, [0, 11, 7]) == [1, 11, 7]
    assert [i["name"] for i in client.get_model_metadata("simple_sequence")["inputs"]] == ["INPUT"]


def test_dyna_sequences_accumulate_and_add_their_id_at_the_end(sequence_server):
    client = grpcclient.InferenceServerClient(sequence_server.grpc_url)
    assert _sequence(client, grpcclient, "simple_dyna_sequence", 1001, [5, 3, 2]) == [5, 8, 10 + 1001]
    assert _sequence(client, grpcclient, "simple_string_dyna_sequence", "1002", [20, -11]) == [20, 9 + 1002]


def test_implicit_state_round_trips_per_sequence_on_a_stream(sequence_server):
    client = grpcclient.InferenceServerClient(sequence_server.grpc_url)
    received: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: received.put((result, error)))
    plan = [(11, 1), (12, 100), (11, 2), (12, 200), (11, 3), (12, 300)]
    try:
        for i, (corrid, value) in enumerate(plan):
            tensor = grpcclient.InferInput("INPUT", [1, 1], "INT32")
            tensor.set_data_from_numpy(np.full((1, 1), value, np.int32))
            client.async_stream_infer("simple_sequence_state", [tensor], request_id=str(i), sequence_id=corrid,
                                      sequence_start=i < 2, sequence_end=i >= 4)
        outputs = {}
        for _ in plan:
            result, error = received.get(timeout=30)
            assert error is None, error
            response = result.get_response()
            assert [o.name for o in response.outputs] == ["OUTPUT"]  # the state output stays in the server
            outputs[int(response.id)] = int(result.as_numpy("OUTPUT")[0, 0])
    finally:
        client.stop_stream()
    assert [outputs[i] for i in range(len(plan))] == [1, 100, 3, 300, 6, 600]
