"""The HTTP tensor codec against tritonclient's own request writer and response reader (no server)."""
from __future__ import annotations

import gzip
import zlib

import numpy as np
import orjson
import pytest
import tritonclient.http as httpclient

from modelplex.core.errors import InternalError, InvalidInput
from modelplex.core.tensors import InferResponse, InferTensor
from modelplex.http.body import decompress, response_encoding
from modelplex.http.codec import OutputFormat, decode_request, encode_response

SAMPLES = {
    "BOOL": np.array([[True, False, True]]),
    "UINT8": np.array([[0, 7, 255]], np.uint8),
    "UINT16": np.array([[0, 7, 65535]], np.uint16),
    "UINT32": np.array([[0, 7, 2**32 - 1]], np.uint32),
    "UINT64": np.array([[0, 7, 2**64 - 1]], np.uint64),
    "INT8": np.array([[-128, 0, 127]], np.int8),
    "INT16": np.array([[-32768, 0, 32767]], np.int16),
    "INT32": np.array([[-2**31, 0, 2**31 - 1]], np.int32),
    "INT64": np.array([[-2**63, 0, 2**63 - 1]], np.int64),
    "FP16": np.array([[-1.5, 0.0, 65504.0]], np.float16),
    "FP32": np.array([[-1.5, 0.25, 3.4e38]], np.float32),
    "FP64": np.array([[-1.5, 0.1, 1e300]], np.float64),
    "BYTES": np.array([[b"", b"a\x00b", "żółw".encode()]], np.object_),
}


def client_body(arrays: dict[str, np.ndarray], binary: bool | dict[str, bool] = True, outputs=None):
    """The exact body tritonclient.http would POST for these inputs."""
    inputs = []
    for name, array in arrays.items():
        datatype = "BYTES" if array.dtype == np.object_ else httpclient.np_to_triton_dtype(array.dtype)
        tensor = httpclient.InferInput(name, list(array.shape), datatype)
        tensor.set_data_from_numpy(array, binary_data=binary if isinstance(binary, bool) else binary[name])
        inputs.append(tensor)
    body, json_size = httpclient.InferenceServerClient.generate_request_body(inputs, outputs=outputs)
    return (body.encode() if isinstance(body, str) else body), json_size


def decode(body: bytes, header_length=None):
    return decode_request(bytearray(body), header_length, "m")


def client_result(tensors: list[InferTensor], fmt: OutputFormat):
    """Encode a response and read it back the way tritonclient.http does."""
    body, header_length = encode_response(InferResponse("m", "1", tensors, id="42"), fmt)
    return httpclient.InferenceServerClient.parse_response_body(body, header_length=header_length), body


@pytest.mark.parametrize("datatype", sorted(SAMPLES))
def test_binary_inputs_decode_to_the_client_arrays(datatype):
    array = SAMPLES[datatype]
    request, fmt = decode(*client_body({"x": array}))
    tensor = request.inputs[0]
    assert (tensor.name, tensor.datatype, tensor.shape) == ("x", datatype, [1, 3])
    assert tensor.data.dtype == array.dtype and tensor.data.shape == array.shape
    assert tensor.data.tolist() == array.tolist()
    assert fmt.binary_default is True  # no outputs named: tritonclient asks for all outputs as binary


@pytest.mark.parametrize("datatype", sorted(set(SAMPLES) - {"FP16"}))
def test_json_inputs_decode_to_the_client_arrays(datatype):
    array = SAMPLES[datatype]
    body, json_size = client_body({"x": array}, binary=False)
    assert json_size is None
    tensor = decode(body)[0].inputs[0]
    assert tensor.data.dtype == array.dtype and tensor.data.tolist() == array.tolist()


def test_mixed_inputs_and_output_choices_as_tritonclient_sends_them():
    a, b = np.arange(16, dtype=np.int32).reshape(1, 16), np.ones((1, 16), np.int32)
    outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=True),
               httpclient.InferRequestedOutput("OUTPUT1", binary_data=False)]
    request, fmt = decode(*client_body({"INPUT0": a, "INPUT1": b}, {"INPUT0": True, "INPUT1": False}, outputs))
    assert request.input("INPUT0").data.tolist() == a.tolist()
    assert request.input("INPUT1").data.tolist() == b.tolist()
    assert request.input("INPUT0").parameters == {} and request.parameters == {}
    assert [o.name for o in request.outputs] == ["OUTPUT0", "OUTPUT1"]
    assert [o.parameters for o in request.outputs] == [{}, {}]
    assert (fmt.is_binary("OUTPUT0"), fmt.is_binary("OUTPUT1")) == (True, False)


def test_binary_inputs_are_writable_views_of_the_body():
    body, json_size = client_body({"x": SAMPLES["FP32"]})
    buffer = bytearray(body)
    tensor = decode_request(buffer, json_size, "m")[0].inputs[0]
    assert tensor.data.flags.writeable and np.shares_memory(tensor.data, np.frombuffer(buffer, np.uint8))


def test_bytes_json_data_nested_deeper_than_python_recursion():
    depth = 1010  # orjson parses up to 1024 levels; Python recursion stops near 1000
    body = b'{"inputs":[{"name":"s","datatype":"BYTES","shape":[2],"data":[' + b"[" * depth + b'"a"' + \
        b"]" * depth + b',"b"]}]}'
    assert decode(body)[0].inputs[0].data.tolist() == [b"a", b"b"]


def test_request_id_parameters_and_nested_json_data_pass_through():
    body = orjson.dumps({"id": "r7", "parameters": {"priority": 2, "binary_data_output": False, "x": "y"},
                         "inputs": [{"name": "a", "datatype": "INT64", "shape": [2, 2], "data": [[1, 2], [3, 4]],
                                     "parameters": {"note": 1}}],
                         "outputs": [{"name": "o", "parameters": {"classification": 3}}]})
    request, fmt = decode(body)
    assert (request.id, request.parameters) == ("r7", {"priority": 2, "x": "y"})
    assert request.inputs[0].data.tolist() == [[1, 2], [3, 4]] and request.inputs[0].parameters == {"note": 1}
    assert request.outputs[0].parameters == {"classification": 3} and not fmt.is_binary("o")


@pytest.mark.parametrize("datatype", sorted(SAMPLES))
def test_outputs_read_back_by_tritonclient_binary_and_json(datatype):
    array = SAMPLES[datatype]
    tensors = [InferTensor("bin", datatype, [1, 3], array), InferTensor("js", datatype, [1, 3], array)]
    fmt = OutputFormat(True, {"js": False})
    if datatype == "FP16":
        with pytest.raises(InvalidInput, match="sending FP16 data via JSON is not supported"):
            client_result(tensors, fmt)
        tensors.pop()
    result, _ = client_result(tensors, fmt)
    for name in [t.name for t in tensors]:
        got = result.as_numpy(name)
        # tritonclient reads JSON BYTES outputs as str, binary ones as bytes
        want = [[b.decode() for b in row] for row in array.tolist()] if (datatype, name) == ("BYTES", "js") \
            else array.tolist()
        assert got.shape == (1, 3) and got.tolist() == want, name
    header = result.get_response()
    assert (header["model_name"], header["model_version"], header["id"]) == ("m", "1", "42")


def test_json_only_response_has_no_header_length_and_flat_data():
    body, header_length = encode_response(
        InferResponse("m", "1", [InferTensor("o", "INT32", [2, 2], np.arange(4, dtype=np.int32).reshape(2, 2))]),
        OutputFormat())
    assert header_length is None
    assert orjson.loads(body) == {"model_name": "m", "model_version": "1",
                                  "outputs": [{"name": "o", "datatype": "INT32", "shape": [2, 2], "data": [0, 1, 2, 3]}]}


def test_bytes_output_that_is_not_utf8_needs_binary():
    tensor = InferTensor("o", "BYTES", [1], np.array([b"\xff"], np.object_))
    with pytest.raises(InvalidInput, match="not UTF-8"):
        encode_response(InferResponse("m", "1", [tensor]), OutputFormat())
    assert client_result([tensor], OutputFormat(True))[0].as_numpy("o").tolist() == [b"\xff"]


def test_unserializable_response_parameter_is_an_internal_error():
    with pytest.raises(InternalError, match="cannot be written as JSON"):
        encode_response(InferResponse("m", "1", [], parameters={"x": object()}), OutputFormat())


def json_input(**fields):
    return orjson.dumps({"inputs": [{"name": "x", "datatype": "INT32", "shape": [1, 3]} | fields]})


BAD_REQUESTS = [
    (b"{not json", None, "malformed JSON"),
    (b"[1, 2]", None, "must be a JSON object"),
    (b"{}", None, "non-empty 'inputs'"),
    (json_input(data=[1, 2, 3], datatype="INT33"), None, "unsupported datatype 'INT33'"),
    (json_input(data=[1, 2, 3], shape=[1, -3]), None, "non-negative integers"),
    (json_input(data=[1, 2, 3], shape=[True, 3]), None, "non-negative integers"),
    (json_input(data=[1, 2]), None, "shape needs 3 elements but 'data' has 2"),
    (json_input(data=[1.5, 2, 3]), None, "datatype INT32 but 'data' holds floats"),
    (json_input(data=["1", "2", "3"]), None, "datatype INT32 but 'data' holds strings"),
    (json_input(data=[1, None, 3]), None, "datatype INT32 but 'data' holds mixed values"),
    (json_input(data=[[1, 2], [3]]), None, "ragged"),
    (b'{"inputs":[{"name":"x","datatype":"INT32","shape":[1],"data":' + b"[" * 100 + b"1" + b"]" * 100 + b"}]}",
     None, "ragged or nested too deeply"),
    (json_input(data=[1, 2, 2**31]), None, "out of range for INT32"),
    (json_input(data=[1, 2, 3], datatype="BOOL"), None, "datatype BOOL but 'data' holds integers"),
    (json_input(data=[1, 2, 3], datatype="BYTES"), None, "must be a string"),
    (json_input(data=[1.0, 2.0, 3.0], datatype="FP16"), None, "receiving FP16 data via JSON is not supported"),
    (json_input(data=7), None, "'data' must be a list"),
    (json_input(), None, "neither 'data' nor a binary_data_size"),
    (json_input(data=[1, 2, 3], parameters={"binary_data_size": 12}), None, "both 'data' and a binary_data_size"),
    (json_input(data=[1, 2, 3], parameters={"shared_memory_region": "r"}), None,
     "must set only one of 'data', 'binary_data_size'"),
    (orjson.dumps({"inputs": [{"name": "x", "datatype": "INT32", "shape": [1], "data": [1]}], "id": 5}), None,
     "'id' must be a string"),
    (orjson.dumps({"inputs": [{"name": "x", "datatype": "INT32", "shape": [1], "data": [1]}],
                   "parameters": {"binary_data_output": "yes"}}), None, "binary_data_output must be true or false"),
    (orjson.dumps({"inputs": [{"name": "x", "datatype": "INT32", "shape": [1], "data": [1]}], "outputs": [{}]}),
     None, "'outputs' must be an object with a 'name'"),
]


@pytest.mark.parametrize("body, header_length, message", BAD_REQUESTS, ids=[m for _, _, m in BAD_REQUESTS])
def test_bad_json_requests_name_the_problem(body, header_length, message):
    with pytest.raises(InvalidInput, match=message):
        decode(body, header_length)


def test_binary_tail_shorter_longer_or_mismatched_is_refused():
    body, json_size = client_body({"x": SAMPLES["INT32"]})
    with pytest.raises(InvalidInput, match="declares 12 bytes of binary data but only 8 bytes are left"):
        decode(body[:-4], json_size)
    with pytest.raises(InvalidInput, match="carries 14 bytes of binary tensor data but .* add up to 12"):
        decode(body + b"\0\0", json_size)
    with pytest.raises(InvalidInput, match="outside the body"):
        decode(body, len(body) + 1)
    header = orjson.loads(body[:json_size])
    header["inputs"][0]["shape"] = [1, 4]
    head = orjson.dumps(header)
    with pytest.raises(InvalidInput, match="binary_data_size is 12 bytes but shape and datatype INT32 need 16"):
        decode(head + body[json_size:], len(head))


def test_truncated_or_overlong_binary_bytes_elements_are_refused():
    body, json_size = client_body({"s": np.array([b"abc", b"de"], np.object_)})
    header = orjson.loads(body[:json_size])
    tail = body[json_size:]

    def with_tail(new_tail: bytes, shape=(2,)):
        header["inputs"][0]["parameters"]["binary_data_size"] = len(new_tail)
        header["inputs"][0]["shape"] = list(shape)
        head = orjson.dumps(header)
        return decode(head + new_tail, len(head))

    with pytest.raises(InvalidInput, match="element 1 is 2 bytes long but only 1 bytes remain"):
        with_tail(tail[:-1])
    with pytest.raises(InvalidInput, match="ends after 2 of 3 elements"):
        with_tail(tail + b"\0\0", shape=(3,))
    with pytest.raises(InvalidInput, match="13 bytes of binary data cannot hold the 100000 BYTES elements"):
        with_tail(tail, shape=(10**5,))
    with pytest.raises(InvalidInput, match="1000000000000 elements; the server's limit is"):
        with_tail(tail, shape=(10**12,))  # the count alone is refused, before the body is looked at
    with pytest.raises(InvalidInput, match="2 bytes are left after the 1 BYTES elements"):
        with_tail(tail[:7] + b"zz", shape=(1,))
    assert with_tail(tail)[0].inputs[0].data.tolist() == [b"abc", b"de"]


def test_compressed_bodies_and_accept_encoding():
    body = client_body({"x": SAMPLES["INT32"]}, binary=False)[0]
    assert decompress(gzip.compress(body), "gzip", 1 << 20) == body
    assert decompress(zlib.compress(body), "deflate", 1 << 20) == body
    with pytest.raises(InvalidInput, match="exceeds the server's limit of 10 bytes"):
        decompress(gzip.compress(body), "gzip", 10)
    with pytest.raises(InvalidInput, match="not valid gzip"):
        decompress(body, "gzip", 1 << 20)
    with pytest.raises(InvalidInput, match="truncated gzip"):
        decompress(gzip.compress(body)[:-12], "gzip", 1 << 20)
    with pytest.raises(InvalidInput, match="unsupported Content-Encoding 'br'"):
        decompress(body, "br", 1 << 20)
    assert response_encoding("gzip") == "gzip" and response_encoding("deflate, gzip;q=0.5") == "gzip"
    assert response_encoding("deflate") == "deflate" and response_encoding("gzip;q=0, br") is None
    assert response_encoding("gzip; q=0.000, deflate;q=0.2") == "deflate" and response_encoding("gzip;q=x") is None
    assert response_encoding(None) is None
