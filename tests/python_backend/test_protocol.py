"""The worker protocol and pb_utils on their own (no server): tensors survive the trip bit for bit."""
from __future__ import annotations

import socket
import threading

import numpy as np
import pytest

import triton_python_backend_utils as pb_utils
from modelplex_python.protocol import Channel, ChannelClosed, decode_tensor, encode_tensor

ARRAYS = {
    "fp32": np.arange(12, dtype=np.float32).reshape(3, 4),
    "fp16": np.array([0.5, -2], np.float16),
    "bool": np.array([[True, False]]),
    "uint64": np.array([2**64 - 1], np.uint64),
    "empty": np.zeros((0, 5), np.int32),
    "scalar": np.array(7, np.int64),
    "bytes": np.array([[b"a\x00b", b""], [b"\xff" * 300, b"tail"]], dtype=np.object_),
    "fortran": np.asfortranarray(np.arange(6, dtype=np.int16).reshape(2, 3)),
}


def test_tensors_round_trip_through_a_socket():
    left, right = socket.socketpair()
    sender, receiver = Channel(left), Channel(right)
    buffers: list = []
    descs = [encode_tensor(name, array, buffers) for name, array in ARRAYS.items()]
    # Big enough to need several reads, sent from another thread as the worker's threads do.
    big = np.random.default_rng(0).standard_normal(300_000).astype(np.float32)
    descs.append(encode_tensor("big", big, buffers))
    thread = threading.Thread(target=sender.send, args=({"op": "test", "tensors": descs}, buffers))
    thread.start()
    header, received = receiver.receive()
    thread.join()
    assert header["op"] == "test"
    decoded = {d["name"]: decode_tensor(d, received) for d in header["tensors"]}
    for name, array in {**ARRAYS, "big": big}.items():
        assert decoded[name].dtype == array.dtype and decoded[name].shape == array.shape, name
        np.testing.assert_array_equal(decoded[name], array, err_msg=name)
    decoded["fp32"][0, 0] = 42  # model code may write into its inputs
    sender.close()
    with pytest.raises(ChannelClosed):
        receiver.receive()


def test_text_arrays_become_bytes_and_unsupported_values_are_refused():
    tensor = pb_utils.Tensor("T", np.array(["héllo", "x"]))
    assert tensor.as_numpy().tolist() == ["héllo".encode(), b"x"] and tensor.triton_dtype() == 13
    assert pb_utils.Tensor("T", [[1, 2]]).shape() == [1, 2]  # array-likes, as Triton's binding takes them
    with pytest.raises(pb_utils.TritonModelException, match="only bytes or str"):
        pb_utils.Tensor("T", [b"ok", None])
    with pytest.raises(pb_utils.TritonModelException, match="complex128 has no Triton datatype"):
        pb_utils.Tensor("T", np.ones(2, np.complex128))
    encoded = pb_utils.serialize_byte_tensor(np.array([b"ab", b"c"], dtype=np.object_))
    assert pb_utils.deserialize_bytes_tensor(encoded).tolist() == [b"ab", b"c"]


def test_a_response_sender_refuses_sends_after_the_final_flag():
    sent = []
    sender = pb_utils.InferenceResponseSender(lambda response, final: sent.append((response, final)))
    response = pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.ones(1, np.int32))])
    sender.send(response)
    with pytest.raises(pb_utils.TritonModelException, match="needs a response"):
        sender.send()
    sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    with pytest.raises(pb_utils.TritonModelException, match="has been closed"):
        sender.send(response)
    assert sent == [(response, False), (None, True)]


def test_auto_complete_model_config_refuses_conflicts():
    config = pb_utils.ModelConfig('{"name": "m", "max_batch_size": 8, "input": [{"name": "A", '
                                  '"data_type": "TYPE_FP32", "dims": [2]}]}')
    config.add_input({"name": "A", "data_type": "TYPE_FP32", "dims": [2]})  # the same again is fine
    with pytest.raises(ValueError, match="already has dims"):
        config.add_input({"name": "A", "data_type": "TYPE_FP32", "dims": [3]})
    with pytest.raises(ValueError, match="max_batch_size 8"):
        config.set_max_batch_size(4)
    with pytest.raises(ValueError, match="missing 'dims'"):
        config.add_output({"name": "B", "data_type": "TYPE_FP32"})
    assert [t["name"] for t in config.as_dict()["input"]] == ["A"]


def test_bls_and_model_control_outside_execute_raise_instead_of_waiting():
    request = pb_utils.InferenceRequest(model_name="simple", inputs=[], requested_output_names=[])
    with pytest.raises(pb_utils.TritonModelException, match="BLS calls work in execute"):
        request.exec()
    with pytest.raises(pb_utils.TritonModelException, match="model control works in execute"):
        pb_utils.is_model_ready("simple")


def test_tensors_cross_to_torch_and_back_through_dlpack():
    torch = pytest.importorskip("torch")
    tensor = pb_utils.Tensor("x", np.arange(6, dtype=np.float32).reshape(2, 3))
    assert torch.equal(torch.from_dlpack(tensor), torch.arange(6, dtype=torch.float32).reshape(2, 3))
    assert torch.equal(torch.utils.dlpack.from_dlpack(tensor.to_dlpack()), torch.from_dlpack(tensor))
    back = pb_utils.Tensor.from_dlpack("y", torch.ones(2, dtype=torch.int64))
    assert back.name() == "y" and back.as_numpy().tolist() == [1, 1] and back.triton_dtype() == 9


def test_a_peer_that_closes_with_frames_unread_is_a_closed_channel(tmp_path):
    """Closing a socket with data still unread on its side resets the connection (ECONNRESET, not
    EOF). A worker whose server went away like that used to stay alive as an orphan: its reader
    thread died on the reset instead of ending the process."""
    import subprocess
    import sys

    left, right = socket.socketpair()
    Channel(left).send({"op": "x"}, [])
    right.close()  # the frame is still in its receive queue
    with pytest.raises(ChannelClosed, match="closed the channel"):
        Channel(left).receive()

    # A real worker: the server end sends init and closes without reading the worker's "ready".
    model_file = tmp_path / "model.py"
    model_file.write_text("class TritonPythonModel:\n    def execute(self, requests):\n        return []\n")
    server_sock, worker_sock = socket.socketpair()
    worker = subprocess.Popen([sys.executable, "-m", "modelplex_python.worker", str(worker_sock.fileno())],
                              pass_fds=[worker_sock.fileno()], stdin=subprocess.DEVNULL)
    worker_sock.close()
    try:
        Channel(server_sock).send({"op": "init", "model_file": str(model_file), "decoupled": False, "args": {}}, [])
        server_sock.settimeout(30)
        assert server_sock.recv(1, socket.MSG_PEEK)  # "ready" is waiting, unread
        server_sock.close()
        assert worker.wait(timeout=10) == 0
    finally:
        if worker.poll() is None:
            worker.kill()
