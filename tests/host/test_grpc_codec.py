"""The gRPC tensor codec against tritonclient's own serializers and readers, and the error table (no server)."""
from __future__ import annotations

import grpc
import numpy as np
import pytest
from tritonclient.grpc import InferResult
from tritonclient.grpc import service_pb2 as pb
from tritonclient.utils import serialize_byte_tensor

from modelplex.core.errors import InternalError, InvalidInput, NotFound, Unavailable, Unsupported
from modelplex.core.tensors import InferResponse, InferTensor
from modelplex.grpc.codec import decode_request, encode_response
from modelplex.grpc.status import pushback, status_code

NUMERIC = ["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP16", "FP32", "FP64"]
DTYPES = {"BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
          "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64, "FP16": np.float16,
          "FP32": np.float32, "FP64": np.float64}


def sample(datatype: str, shape=(2, 3)) -> np.ndarray:
    return (np.arange(np.prod(shape)).reshape(shape) % 2 == 1 if datatype == "BOOL"
            else (np.arange(np.prod(shape)).reshape(shape) * 3 + 1).astype(DTYPES[datatype]))


def raw_request(*tensors: tuple[str, str, np.ndarray, bytes]) -> pb.ModelInferRequest:
    msg = pb.ModelInferRequest(model_name="m", id="req-1")
    for name, datatype, array, raw in tensors:
        msg.inputs.add(name=name, datatype=datatype, shape=array.shape)
        msg.raw_input_contents.append(raw)
    return msg


@pytest.mark.parametrize("datatype", NUMERIC)
def test_raw_numeric_inputs_decode_to_the_same_array(datatype):
    array = sample(datatype)
    request = decode_request(raw_request(("X", datatype, array, array.tobytes())))
    tensor = request.inputs[0]
    assert (tensor.name, tensor.datatype, tensor.shape) == ("X", datatype, [2, 3])
    assert tensor.data.dtype == array.dtype
    np.testing.assert_array_equal(tensor.data, array)
    assert request.id == "req-1" and request.model_name == "m"


def test_raw_bytes_input_uses_tritonclients_length_prefixes():
    array = np.array([[b"a", b""], [b"\x00\xffz", "h\xe9llo".encode()]], dtype=np.object_)
    raw = serialize_byte_tensor(array).item()
    tensor = decode_request(raw_request(("S", "BYTES", array, raw))).inputs[0]
    assert tensor.data.dtype == np.object_ and tensor.data.shape == (2, 2)
    assert tensor.data.tolist() == array.tolist()


@pytest.mark.parametrize("datatype", [d for d in NUMERIC if d != "FP16"] + ["BYTES"])
def test_typed_contents_decode_like_raw(datatype):
    field = {"BOOL": "bool_contents", "INT64": "int64_contents", "UINT64": "uint64_contents",
             "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents"}.get(
        datatype, "uint_contents" if datatype.startswith("UINT") else "int_contents")
    array = (np.array([[b"x", b"yz", b""]] * 2, dtype=np.object_) if datatype == "BYTES" else sample(datatype))
    msg = pb.ModelInferRequest(model_name="m")
    t = msg.inputs.add(name="X", datatype=datatype, shape=array.shape)
    getattr(t.contents, field).extend(array.flatten().tolist())
    tensor = decode_request(msg).inputs[0]
    assert tensor.data.shape == array.shape
    assert tensor.data.tolist() == array.tolist()
    if datatype != "BYTES":
        assert tensor.data.dtype == array.dtype


def test_parameters_of_request_inputs_and_outputs_become_python_values():
    msg = raw_request(("X", "INT32", sample("INT32"), sample("INT32").tobytes()))
    msg.parameters["b"].bool_param = True
    msg.parameters["i"].int64_param = -7
    msg.parameters["u"].uint64_param = 2**64 - 1
    msg.parameters["d"].double_param = 0.5
    msg.parameters["s"].string_param = "text"
    msg.inputs[0].parameters["binary_data_size"].int64_param = 24
    out = msg.outputs.add(name="Y")
    out.parameters["classification"].int64_param = 3
    request = decode_request(msg)
    assert request.parameters == {"b": True, "i": -7, "u": 2**64 - 1, "d": 0.5, "s": "text"}
    assert request.inputs[0].parameters == {"binary_data_size": 24}
    assert [(o.name, o.parameters) for o in request.outputs] == [("Y", {"classification": 3})]


def test_response_reads_back_with_tritonclients_infer_result():
    ints, text = sample("INT32", (1, 4)), np.array([[b"one", b"", b"three"]], dtype=np.object_)
    halves = sample("FP16", (3,))
    response = InferResponse("m", "1", [InferTensor("A", "INT32", [1, 4], ints),
                                        InferTensor("S", "BYTES", [1, 3], text),
                                        InferTensor("H", "FP16", [3], halves, {"note": "x"})],
                             id="r9", parameters={"flag": True, "n": 4, "x": 1.5, "name": "z"})
    msg = encode_response(response)
    result = InferResult(msg)
    np.testing.assert_array_equal(result.as_numpy("A"), ints)
    assert result.as_numpy("S").tolist() == text.tolist()
    np.testing.assert_array_equal(result.as_numpy("H"), halves)
    assert (msg.model_name, msg.model_version, msg.id) == ("m", "1", "r9")
    assert msg.outputs[2].parameters["note"].string_param == "x"
    params = {k: getattr(v, v.WhichOneof("parameter_choice")) for k, v in msg.parameters.items()}
    assert params == {"flag": True, "n": 4, "x": 1.5, "name": "z"}


def test_response_casts_data_to_the_declared_datatype_and_encodes_text():
    response = InferResponse("m", "1", [InferTensor("A", "FP32", [2], np.array([1.5, 2.5])),
                                        InferTensor("S", "BYTES", [2], np.array(["é", 7], dtype=np.object_))])
    result = InferResult(encode_response(response))
    assert result.as_numpy("A").dtype == np.float32
    np.testing.assert_array_equal(result.as_numpy("A"), [1.5, 2.5])
    assert result.as_numpy("S").tolist() == ["é".encode(), b"7"]


def bad_requests():
    ints = sample("INT32", (1, 4))
    short = raw_request(("X", "INT32", ints, ints.tobytes()[:-4]))
    yield "unexpected total byte size 12 for input 'X', expecting 16", short
    extra = raw_request(("X", "INT32", ints, ints.tobytes()))
    extra.raw_input_contents.append(b"\x00" * 16)
    yield "raw_input_contents must hold one entry per input not in shared memory: got 2 for 1 inputs", extra
    both = raw_request(("X", "INT32", ints, ints.tobytes()))
    both.inputs[0].contents.int_contents.extend(ints.flatten().tolist())
    yield "input 'X' carries both raw_input_contents and typed contents", both
    empty = pb.ModelInferRequest(model_name="m")
    empty.inputs.add(name="X", datatype="INT32", shape=[1, 4])
    yield "input 'X' has no data", empty
    few = pb.ModelInferRequest(model_name="m")
    few.inputs.add(name="X", datatype="INT32", shape=[1, 4]).contents.int_contents.extend([1, 2, 3])
    yield "unexpected number of elements 3 in int_contents of input 'X', expecting 4", few
    overflow = pb.ModelInferRequest(model_name="m")
    overflow.inputs.add(name="X", datatype="INT8", shape=[1]).contents.int_contents.append(300)
    yield "does not fit datatype INT8", overflow
    half = pb.ModelInferRequest(model_name="m")
    half.inputs.add(name="X", datatype="FP16", shape=[1]).contents.fp32_contents.append(1.0)
    yield "datatype 'FP16' can only be sent in raw_input_contents", half
    yield "unsupported datatype 'INT4'", raw_request(("X", "INT4", ints, ints.tobytes()))
    yield "negative dimension", raw_request(("X", "INT32", ints, ints.tobytes()))
    text = np.array([b"ab", b"cd"], dtype=np.object_)
    packed = serialize_byte_tensor(text).item()
    yield "binary BYTES data ends after 2 of 3 elements", raw_request(("S", "BYTES", np.empty(3, np.object_), packed))
    yield "BYTES element 1 is 2 bytes long but only 1 bytes remain", raw_request(("S", "BYTES", text, packed[:-1]))
    yield "6 bytes are left after the 1 BYTES elements", raw_request(("S", "BYTES", text[:1], packed))


@pytest.mark.parametrize("expected, msg", list(bad_requests()), ids=lambda v: v if isinstance(v, str) else "")
def test_bad_input_data_is_an_invalid_input_naming_the_problem(expected, msg):
    if expected == "negative dimension":
        msg.inputs[0].shape[1] = -4
    with pytest.raises(InvalidInput, match=expected.replace("(", r"\(")):
        decode_request(msg)


def test_shared_memory_inputs_take_no_raw_entry_and_are_left_for_the_data_plane():
    msg = pb.ModelInferRequest(model_name="m")
    shm_input = msg.inputs.add(name="X", datatype="INT32", shape=[1, 4])
    shm_input.parameters["shared_memory_region"].string_param = "r"
    shm_input.parameters["shared_memory_byte_size"].int64_param = 16
    msg.inputs.add(name="Y", datatype="INT32", shape=[2])
    msg.raw_input_contents.append(np.array([5, 6], np.int32).tobytes())  # Y's: X, in shared memory, has none
    request = decode_request(msg)
    assert request.inputs[0].data is None and request.inputs[0].parameters["shared_memory_byte_size"] == 16
    assert request.inputs[1].data.tolist() == [5, 6]
    msg.raw_input_contents.append(b"\0" * 16)
    with pytest.raises(InvalidInput, match="one entry per input not in shared memory: got 2 for 1"):
        decode_request(msg)


def test_every_typed_error_has_its_grpc_code():
    assert [status_code(e("x")) for e in (InvalidInput, NotFound, Unavailable, Unsupported, InternalError)] == [
        grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.INTERNAL]


def test_unavailable_errors_carry_grpc_retry_pushback():
    assert pushback(Unavailable("queue full", retry_after=1.5)) == (("grpc-retry-pushback-ms", "1500"),)
    assert pushback(Unavailable("not ready")) == ()
    assert pushback(InvalidInput("bad")) == ()
