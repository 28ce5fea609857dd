"""Property-based tests (hypothesis) of the HTTP binary tensor codec: whatever tritonclient builds decodes
to the same arrays, responses parse back in tritonclient, and any mangled body is an InvalidInput (400)."""
from __future__ import annotations

import json

import numpy as np
import tritonclient.http as httpclient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from modelplex.core.errors import InvalidInput
from modelplex.core.tensors import InferResponse, InferTensor
from modelplex.http.codec import OutputFormat, decode_request, encode_response

DTYPES = {"BOOL": np.bool_, "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64,
          "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
          "FP16": np.float16, "FP32": np.float32, "FP64": np.float64}
FAST = settings(max_examples=75, deadline=None, suppress_health_check=[HealthCheck.too_slow])
shapes = hnp.array_shapes(min_dims=1, max_dims=3, min_side=0, max_side=5)


@st.composite
def tensors(draw):
    """(datatype, array): numeric arrays of any listed dtype, or BYTES object arrays of arbitrary bytes."""
    datatype = draw(st.sampled_from([*DTYPES, "BYTES"]))
    shape = draw(shapes)
    if datatype == "BYTES":
        values = draw(st.lists(st.binary(max_size=12), min_size=int(np.prod(shape)), max_size=int(np.prod(shape))))
        return datatype, np.array(values + [b""], dtype=np.object_)[:-1].reshape(shape)
    return datatype, draw(hnp.arrays(DTYPES[datatype], shape))


def client_body(arrays: list[tuple[str, np.ndarray]], binary: list[bool]) -> tuple[bytes, int | None]:
    inputs = []
    for i, ((datatype, array), is_binary) in enumerate(zip(arrays, binary)):
        tensor = httpclient.InferInput(f"IN{i}", list(array.shape), datatype)
        tensor.set_data_from_numpy(array, binary_data=is_binary)
        inputs.append(tensor)
    body, json_size = httpclient.InferenceServerClient.generate_request_body(inputs)
    return (body.encode() if isinstance(body, str) else body), json_size


def json_can_carry(datatype: str, array: np.ndarray) -> bool:
    """tritonclient refuses FP16, NaN/inf and non-UTF-8 BYTES in JSON."""
    if datatype == "BYTES":
        try:
            [v.decode() for v in array.ravel()]
        except UnicodeDecodeError:
            return False
        return True
    return datatype != "FP16" and (array.dtype.kind != "f" or bool(np.isfinite(array).all()))


def same(expected: np.ndarray, got: np.ndarray) -> None:
    assert got.shape == expected.shape
    if expected.dtype == np.object_:
        assert [bytes(v) for v in got.ravel()] == list(expected.ravel())
    elif expected.dtype.kind == "f":
        np.testing.assert_array_equal(got.astype(expected.dtype), expected)  # NaN == NaN here
    else:
        np.testing.assert_array_equal(got, expected)


@FAST
@given(st.lists(tensors(), min_size=1, max_size=3), st.data())
def test_what_tritonclient_sends_decodes_to_the_same_arrays(arrays, data):
    binary = [data.draw(st.booleans()) or not json_can_carry(d, a) for d, a in arrays]
    body, json_size = client_body(arrays, binary)
    request, _ = decode_request(bytearray(body), json_size, "m")
    assert [t.name for t in request.inputs] == [f"IN{i}" for i in range(len(arrays))]
    for (datatype, array), tensor in zip(arrays, request.inputs):
        assert tensor.datatype == datatype
        same(array, tensor.data)


@FAST
@given(st.lists(tensors(), min_size=1, max_size=3), st.booleans())
def test_responses_parse_back_in_tritonclient(arrays, binary):
    if not binary:
        arrays = [(d, a) for d, a in arrays if json_can_carry(d, a)]
        if not arrays:
            return
    outputs = [InferTensor(f"OUT{i}", d, list(a.shape), a) for i, (d, a) in enumerate(arrays)]
    body, header_length = encode_response(InferResponse("m", "1", outputs), OutputFormat(binary))
    result = httpclient.InferResult.from_response_body(body, header_length=header_length)
    for i, (datatype, array) in enumerate(arrays):
        got = result.as_numpy(f"OUT{i}")
        if datatype == "BYTES":  # tritonclient reads JSON BYTES as str, binary BYTES as bytes
            assert got.shape == array.shape
            assert [v.encode() if isinstance(v, str) else bytes(v) for v in got.ravel()] == list(array.ravel())
        else:
            same(array, got)


@FAST
@given(tensors(), st.data())
def test_any_mangled_body_is_invalid_input_or_decodes(tensor, data):
    body, json_size = client_body([tensor], [True])
    body = bytearray(body)
    action = data.draw(st.sampled_from(["truncate", "flip", "insert", "header_length"]))
    if action == "truncate" and body:
        del body[data.draw(st.integers(0, len(body) - 1)):]
    elif action == "flip" and body:
        i = data.draw(st.integers(0, len(body) - 1))
        body[i] = data.draw(st.integers(0, 255))
    elif action == "insert":
        i = data.draw(st.integers(0, len(body)))
        body[i:i] = data.draw(st.binary(min_size=1, max_size=8))
    else:
        json_size = data.draw(st.one_of(st.none(), st.integers(-5, len(body) + 5)))
    try:
        decode_request(body, json_size, "m")
    except InvalidInput:
        pass


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12)


@FAST
@given(st.fixed_dictionaries({}, optional={
    "name": st.text(max_size=4) | json_values, "datatype": st.sampled_from([*DTYPES, "BYTES", "X"]) | json_values,
    "shape": st.lists(st.integers(-2, 2**40), max_size=3) | json_values, "data": json_values,
    "parameters": st.dictionaries(st.sampled_from(["binary_data_size", "x"]), json_values, max_size=2)}))
def test_any_json_input_is_invalid_input_or_decodes(item):
    try:
        request, _ = decode_request(json.dumps({"inputs": [item]}).encode(), None, "m")
    except InvalidInput:
        return
    [tensor] = request.inputs
    assert list(tensor.data.shape) == list(tensor.shape)
