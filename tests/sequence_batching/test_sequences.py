"""The sequence batcher through the real server and tritonclient: state per sequence, strategies,
affinity, CORRID types, idle release and Triton's errors, over HTTP, gRPC and a gRPC stream."""
from __future__ import annotations

import json
import queue
import threading
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException


def _inputs(module, value: int, batch: int = 1) -> list:
    tensor = module.InferInput("INPUT", [batch, 1], "INT32")
    tensor.set_data_from_numpy(np.full((batch, 1), value, np.int32))
    return [tensor]


def _infer(client, module, model: str, value: int, **sequence):
    result = client.infer(model, _inputs(module, value), **sequence)
    return int(result.as_numpy("OUTPUT")[0, 0]), json.loads(result.as_numpy("INFO")[0, 0])


@pytest.fixture(scope="module")
def http(sequence_server):
    return httpclient.InferenceServerClient(sequence_server.http_url, concurrency=8)


@pytest.fixture(scope="module")
def grpc(sequence_server):
    return grpcclient.InferenceServerClient(sequence_server.grpc_url)


def test_interleaved_sequences_keep_their_own_state_over_http_and_grpc(http, grpc):
    steps = [(http, httpclient, 101, 1), (grpc, grpcclient, 102, 10), (http, httpclient, 101, 2),
             (grpc, grpcclient, 102, 20), (grpc, grpcclient, 101, 3), (http, httpclient, 102, 30)]
    sums, seen = {}, {}
    for i, (client, module, corrid, value) in enumerate(steps):
        first, last = corrid not in seen, i >= len(steps) - 2
        out, info = _infer(client, module, "seq_direct", value, sequence_id=corrid, sequence_start=first,
                           sequence_end=last)
        seen[corrid] = True
        sums[corrid] = sums.get(corrid, 0) + value
        assert out == sums[corrid], (i, out, sums)
        assert info["corrid"] == corrid  # request.correlation_id()
        assert info["flags"] == (1 if first else 0) | (2 if last else 0)  # request.flags()
        controls = info["controls"]
        assert (controls["START"]["value"], controls["END"]["value"], controls["READY"]["value"]) == \
            (int(first), int(last), 1)
        assert controls["CORRID"] == {"value": corrid, "dtype": "uint64", "shape": [1, 1]}
    assert sums == {101: 6, 102: 60}


def test_a_grpc_stream_interleaves_sequences_in_order(sequence_server):
    client = grpcclient.InferenceServerClient(sequence_server.grpc_url)
    received: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: received.put((result, error)))
    plan = [(201, 5), (202, 7), (201, 5), (202, 7), (201, 5), (202, 7)]
    try:
        for i, (corrid, value) in enumerate(plan):
            client.async_stream_infer("seq_direct", _inputs(grpcclient, value), request_id=str(i),
                                      sequence_id=corrid, sequence_start=i < 2, sequence_end=i >= 4)
        outputs = {}
        for _ in plan:
            result, error = received.get(timeout=30)
            assert error is None, error
            outputs[int(result.get_response().id)] = int(result.as_numpy("OUTPUT")[0, 0])
    finally:
        client.stop_stream()
    assert [outputs[i] for i in range(len(plan))] == [5, 7, 10, 14, 15, 21]


def _run_sequences(url: str, model: str, corrids: list[int], num_steps: int, barrier=None) -> dict:
    """Each sequence in its own thread (its own HTTP client); returns the INFO of each step per corrid."""
    infos: dict[int, list] = {}
    errors: list = []

    def run(corrid: int) -> None:
        client = httpclient.InferenceServerClient(url)
        try:
            steps = []
            for step in range(num_steps):
                if barrier is not None:
                    barrier.wait(timeout=30)
                out, info = _infer(client, httpclient, model, corrid, sequence_id=corrid,
                                   sequence_start=step == 0, sequence_end=step == num_steps - 1)
                assert out == corrid * (step + 1)
                steps.append(info)
            infos[corrid] = steps
        except Exception as e:
            errors.append(e)

    threads = [threading.Thread(target=run, args=(c,)) for c in corrids]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    return infos


def test_direct_keeps_each_sequence_on_its_instance_and_row(sequence_server):
    corrids = [301, 302, 303, 304, 305, 306]
    infos = _run_sequences(sequence_server.http_url, "seq_direct", corrids, 4, threading.Barrier(len(corrids)))
    places = {c: {(i["instance"], i["row"]) for i in steps} for c, steps in infos.items()}
    assert all(len(p) == 1 for p in places.values()), places  # one instance and batch row per sequence
    assert len({p.pop() for p in places.values()}) == len(corrids)  # and no two share one
    # A row below the highest busy slot is padded (READY false), so a sequence's row is its slot.
    assert all(i["batch"] > i["row"] for steps in infos.values() for i in steps)
    assert max(i["row"] for steps in infos.values() for i in steps) == 2  # 6 sequences: slots 0-2 of 2 instances


def test_oldest_batches_requests_of_different_sequences_together(sequence_server):
    corrids = [401, 402, 403, 404]
    infos = _run_sequences(sequence_server.http_url, "seq_oldest", corrids, 2, threading.Barrier(len(corrids)))
    # preferred_batch_size 4 with a 2 s delay: each step of the four sequences ran as one execute.
    assert {i["batch"] for steps in infos.values() for i in steps} == {4}
    first = infos[401][0]["controls"]
    assert first["START"] == {"value": 1.0, "dtype": "float32", "shape": [1, 1]}  # fp32_false_true
    assert first["END"]["dtype"] == "bool" and first["END"]["value"] is False  # bool_false_true
    assert infos[401][1]["controls"]["END"]["value"] is True
    assert first["CORRID"] == {"value": 401, "dtype": "int64", "shape": [1, 1]}


@pytest.mark.parametrize("model,corrid,dtype", [("seq_idle", 2**31 - 1, "int32"), ("seq_string", "session-α", "object")])
def test_corrid_of_each_type_is_delivered(http, model, corrid, dtype):
    out, info = _infer(http, httpclient, model, 4, sequence_id=corrid, sequence_start=True, sequence_end=True)
    assert out == 4 and info["corrid"] == corrid
    assert info["controls"]["CORRID"]["dtype"] == dtype and info["controls"]["CORRID"]["value"] == corrid


def test_an_idle_sequence_is_released_and_its_next_request_refused(http, grpc):
    _infer(http, httpclient, "seq_idle", 1, sequence_id=77, sequence_start=True)
    _infer(http, httpclient, "seq_idle", 1, sequence_id=77)  # within max_sequence_idle (0.5 s): fine
    time.sleep(1.0)
    expected = ("inference request for sequence 77 to model 'seq_idle' must specify the START flag on the first "
                "request of the sequence")
    with pytest.raises(InferenceServerException) as http_error:
        _infer(http, httpclient, "seq_idle", 1, sequence_id=77)
    assert http_error.value.status() == "400" and expected in http_error.value.message()
    with pytest.raises(InferenceServerException) as grpc_error:
        _infer(grpc, grpcclient, "seq_idle", 1, sequence_id=77, sequence_end=True)
    assert grpc_error.value.status() == "StatusCode.INVALID_ARGUMENT" and expected in grpc_error.value.message()
    # A new START begins it again from nothing.
    assert _infer(http, httpclient, "seq_idle", 9, sequence_id=77, sequence_start=True, sequence_end=True)[0] == 9


ERRORS = [
    ("seq_direct", {}, 1, "inference request to model 'seq_direct' must specify a non-zero or non-empty "
                          "correlation ID"),
    ("seq_direct", {"sequence_id": 555}, 1, "inference request for sequence 555 to model 'seq_direct' must specify "
                                            "the START flag on the first request of the sequence"),
    ("seq_direct", {"sequence_id": 556, "sequence_start": True}, 2,
     "inference request to model 'seq_direct' must specify batch-size 1 due to requirements of sequence batcher"),
    ("seq_direct", {"sequence_id": "abc", "sequence_start": True}, 1,
     "model 'seq_direct' takes integer sequence IDs that fit TYPE_UINT64 (its CORRID control), got 'abc'"),
    ("seq_idle", {"sequence_id": 2**31, "sequence_start": True}, 1,
     "model 'seq_idle' takes integer sequence IDs that fit TYPE_INT32 (its CORRID control), got 2147483648"),
    ("seq_string", {"sequence_id": 5, "sequence_start": True}, 1,
     "model 'seq_string' takes string sequence IDs (its CORRID control is TYPE_STRING), got the integer 5"),
]


@pytest.mark.parametrize("model,sequence,batch,message", ERRORS)
def test_triton_errors_over_http_and_grpc(http, grpc, model, sequence, batch, message):
    with pytest.raises(InferenceServerException) as http_error:
        http.infer(model, _inputs(httpclient, 1, batch), **sequence)
    assert http_error.value.status() == "400" and message in http_error.value.message()
    with pytest.raises(InferenceServerException) as grpc_error:
        grpc.infer(model, _inputs(grpcclient, 1, batch), **sequence)
    assert grpc_error.value.status() == "StatusCode.INVALID_ARGUMENT" and message in grpc_error.value.message()


def test_a_refused_request_leaves_its_sequence_as_it_was(http):
    assert _infer(http, httpclient, "seq_direct", 3, sequence_id=601, sequence_start=True)[0] == 3
    with pytest.raises(InferenceServerException):
        http.infer("seq_direct", _inputs(httpclient, 100, 2), sequence_id=601)  # batch of 2: refused
    assert _infer(http, httpclient, "seq_direct", 4, sequence_id=601, sequence_end=True)[0] == 7
    with pytest.raises(InferenceServerException, match="must specify the START flag"):
        _infer(http, httpclient, "seq_direct", 1, sequence_id=601)  # ended: unknown again


def test_start_on_a_running_sequence_begins_it_again(http):
    """Triton logs the conflict and continues the sequence from its new START."""
    _infer(http, httpclient, "seq_direct", 50, sequence_id=701, sequence_start=True)
    assert _infer(http, httpclient, "seq_direct", 2, sequence_id=701, sequence_start=True)[0] == 2
    assert _infer(http, httpclient, "seq_direct", 3, sequence_id=701, sequence_end=True)[0] == 5


def test_a_sequence_without_a_free_slot_waits_in_the_backlog(sequence_server, http):
    """seq_string has one instance of 2 slots: a third sequence runs once one of the two ends."""
    _infer(http, httpclient, "seq_string", 1, sequence_id="a", sequence_start=True)
    _infer(http, httpclient, "seq_string", 2, sequence_id="b", sequence_start=True)
    waiting: queue.Queue = queue.Queue()
    client = httpclient.InferenceServerClient(sequence_server.http_url)
    thread = threading.Thread(target=lambda: waiting.put(
        _infer(client, httpclient, "seq_string", 3, sequence_id="c", sequence_start=True)))
    thread.start()
    time.sleep(0.3)
    assert waiting.empty()  # no slot yet (the others idle out only after 5 s)
    assert _infer(http, httpclient, "seq_string", 10, sequence_id="a", sequence_end=True)[0] == 11
    out, info = waiting.get(timeout=30)
    thread.join()
    assert out == 3 and info["row"] == 0  # the slot "a" held
    _infer(http, httpclient, "seq_string", 0, sequence_id="b", sequence_end=True)
    _infer(http, httpclient, "seq_string", 0, sequence_id="c", sequence_end=True)
