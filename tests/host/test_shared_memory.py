"""Triton's system shared-memory extension driven by tritonclient's own shm helpers, over HTTP and gRPC:
register, infer with inputs and outputs in regions (numeric and BYTES), status, unregister."""
from __future__ import annotations

import os
import uuid

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from helpers.infer_clients import PROTOCOLS
from helpers.serverproc import ServerProcess
from tritonclient.utils import InferenceServerException, serialize_byte_tensor

from modelplex.core.shared_memory import SharedMemoryRegistry

MODULES = {"http": httpclient, "grpc": grpcclient}


@pytest.fixture(scope="module")
def shm_server(example_repo):
    with ServerProcess([example_repo], "--model-control-mode", "explicit", "--load-model", "*",
                       "--allow-client-shm", "true") as s:
        yield s


@pytest.fixture
def regions():
    """Makes shm objects with unique keys; destroys them (and their server registrations) after the test."""
    made = []

    def make(byte_size: int):
        key = f"/mp_test_{uuid.uuid4().hex[:12]}"
        handle = shm.create_shared_memory_region(key[1:], key, byte_size)
        made.append(handle)
        return key, handle

    yield make
    for handle in made:
        shm.destroy_shared_memory_region(handle)


def client(server, protocol):
    return MODULES[protocol].InferenceServerClient(server.http_url if protocol == "http" else server.grpc_url)


def status(c, protocol) -> dict[str, dict]:
    answer = c.get_system_shared_memory_status()
    if protocol == "http":
        return {r["name"]: r for r in answer}
    return {name: {"name": r.name, "key": r.key, "offset": r.offset, "byte_size": r.byte_size}
            for name, r in answer.regions.items()}


def no_data(result, protocol: str, name: str) -> bool:
    if protocol == "http":
        output = result.get_output(name)
        return "data" not in output and "binary_data_size" not in output.get("parameters", {})
    response = result.get_response()
    index = [o.name for o in response.outputs].index(name)
    return response.raw_output_contents[index] == b""


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_numeric_inputs_and_outputs_in_shared_memory(shm_server, regions, protocol):
    mod, c = MODULES[protocol], client(shm_server, protocol)
    in_key, in_handle = regions(128)
    out_key, out_handle = regions(128)
    c.register_system_shared_memory(f"in-{protocol}", in_key, 128)
    c.register_system_shared_memory(f"out-{protocol}", out_key, 64, offset=64)  # a region at an offset
    assert status(c, protocol)[f"out-{protocol}"] == {"name": f"out-{protocol}", "key": out_key, "offset": 64,
                                                      "byte_size": 64}
    inputs = [mod.InferInput("INPUT0", [1, 16], "INT32"), mod.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_shared_memory(f"in-{protocol}", 64)
    inputs[1].set_shared_memory(f"in-{protocol}", 64, offset=64)
    outputs = [mod.InferRequestedOutput("OUTPUT0"), mod.InferRequestedOutput("OUTPUT1")]
    outputs[0].set_shared_memory(f"out-{protocol}", 32)  # 16 INT32 need 64: too small
    outputs[1].set_shared_memory(f"out-{protocol}", 64)
    with pytest.raises(InferenceServerException, match="should be at least 64 bytes to hold the results"):
        c.infer("simple", inputs, outputs=outputs[:1])
    outputs[0].set_shared_memory(f"out-{protocol}", 64)
    for round_ in range(2):  # the same InferInput/InferRequestedOutput objects, new data in the regions
        a, b = np.arange(16, dtype=np.int32)[None] * (round_ + 1), np.full((1, 16), 3 + round_, np.int32)
        shm.set_shared_memory_region(in_handle, [a])
        shm.set_shared_memory_region(in_handle, [b], offset=64)
        result = c.infer("simple", inputs, outputs=outputs[1:])  # OUTPUT1 = a - b into the region
        np.testing.assert_array_equal(shm.get_contents_as_numpy(out_handle, np.int32, [1, 16], offset=64), a - b)
        assert no_data(result, protocol, "OUTPUT1")  # the response carries no data for it, as Triton's
        result = c.infer("simple", inputs, outputs=outputs[:1])
        np.testing.assert_array_equal(shm.get_contents_as_numpy(out_handle, np.int32, [1, 16], offset=64), a + b)
        shape = result.get_output("OUTPUT0")["shape"] if protocol == "http" else result.get_output("OUTPUT0").shape
        assert list(shape) == [1, 16]
    c.unregister_system_shared_memory(f"in-{protocol}")
    assert f"in-{protocol}" not in status(c, protocol) and f"out-{protocol}" in status(c, protocol)
    with pytest.raises(InferenceServerException, match=f"Unable to find shared memory region: 'in-{protocol}'"):
        c.infer("simple", inputs)
    c.unregister_system_shared_memory()
    assert status(c, protocol) == {}


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_bytes_inputs_and_outputs_in_shared_memory(shm_server, regions, protocol):
    mod, c = MODULES[protocol], client(shm_server, protocol)
    values = np.arange(16, dtype=np.int32)
    text = np.array([str(v).encode() for v in values], dtype=object).reshape(1, 16)
    ones = np.array([b"1"] * 16, dtype=object).reshape(1, 16)
    serialized0, serialized1 = serialize_byte_tensor(text), serialize_byte_tensor(ones)
    raw0, raw1 = serialized0.item(), serialized1.item()
    key0, handle0 = regions(len(raw0))
    key1, handle1 = regions(len(raw1))
    key_out, handle_out = regions(256)
    shm.set_shared_memory_region(handle0, [serialized0])
    shm.set_shared_memory_region(handle1, [serialized1])
    for name, key, size in ((f"s0-{protocol}", key0, len(raw0)), (f"s1-{protocol}", key1, len(raw1)),
                            (f"so-{protocol}", key_out, 256)):
        c.register_system_shared_memory(name, key, size)
    inputs = [mod.InferInput("INPUT0", [1, 16], "BYTES"), mod.InferInput("INPUT1", [1, 16], "BYTES")]
    inputs[0].set_shared_memory(f"s0-{protocol}", len(raw0))
    inputs[1].set_shared_memory(f"s1-{protocol}", len(raw1))
    out = mod.InferRequestedOutput("OUTPUT0")
    out.set_shared_memory(f"so-{protocol}", 256)
    c.infer("simple_string", inputs, outputs=[out])
    got = shm.get_contents_as_numpy(handle_out, np.object_, [1, 16])
    assert [int(x) for x in got.reshape(-1)] == list(values + 1)
    c.unregister_system_shared_memory()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_bad_regions_are_refused_and_change_nothing(shm_server, regions, protocol):
    c = client(shm_server, protocol)
    key, _ = regions(64)
    name = f"bad-{protocol}"
    for bad_key, words in [("/", "invalid shm key '/'"), ("../etc/passwd", "invalid shm key"),
                           ("/a/b", "invalid shm key"),
                           ("/triton_python_backend_shm_region_x", "contains the reserved prefix"),
                           ("/mp_test_absent_object", "Unable to open shared memory region")]:
        with pytest.raises(InferenceServerException, match=words):
            c.register_system_shared_memory(name, bad_key, 8)
    for offset, size in ((0, 65), (1, 64), (64, 1)):
        with pytest.raises(InferenceServerException, match=f"failed to register shared memory region '{name}'"
                                                          ": invalid args"):
            c.register_system_shared_memory(name, key, size, offset=offset)
    c.register_system_shared_memory(name, key, 64)
    with pytest.raises(InferenceServerException, match=f"shared memory region '{name}' already in manager"):
        c.register_system_shared_memory(name, key, 64)
    with pytest.raises(InferenceServerException, match="Unable to find system shared memory region: 'nope'"):
        c.get_system_shared_memory_status("nope")
    mod = MODULES[protocol]
    inputs = [mod.InferInput("INPUT0", [1, 16], "INT32"), mod.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[1].set_data_from_numpy(np.ones((1, 16), np.int32))
    for offset, size, words in ((64, 64, "Invalid offset for shared memory region"),
                                (8, 64, "Invalid offset \\+ byte size for shared memory region"),
                                (0, 60, "input byte size mismatch for input 'INPUT0' for model 'simple'. "
                                        "Expected 64, got 60")):
        inputs[0] = mod.InferInput("INPUT0", [1, 16], "INT32")  # (set_shared_memory keeps an old offset)
        inputs[0].set_shared_memory(name, size, offset=offset)
        with pytest.raises(InferenceServerException, match=words):
            c.infer("simple", inputs)
    assert list(status(c, protocol)) == [name]
    c.unregister_system_shared_memory(name)
    c.unregister_system_shared_memory("never-registered")  # not an error, as in Triton


def test_a_symlink_in_dev_shm_is_never_followed(shm_server):
    link = f"/dev/shm/mp_test_link_{uuid.uuid4().hex[:8]}"
    os.symlink("/etc/hostname", link)
    try:
        with pytest.raises(InferenceServerException, match="Unable to open shared memory region"):
            client(shm_server, "http").register_system_shared_memory("link", "/" + os.path.basename(link), 4)
    finally:
        os.unlink(link)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_cuda_shared_memory_answers_as_triton_without_gpus(shm_server, protocol):
    c = client(shm_server, protocol)
    c.unregister_cuda_shared_memory()  # what NVIDIA's examples do first: no error
    answer = c.get_cuda_shared_memory_status()
    assert (answer == [] if protocol == "http" else len(answer.regions) == 0)
    with pytest.raises(InferenceServerException, match="failed to register CUDA shared memory region: 'r', "
                                                      "GPUs not supported"):
        c.register_cuda_shared_memory("r", b"\0" * 64, 0, 64)
    metadata = c.get_server_metadata()
    extensions = metadata["extensions"] if protocol == "http" else list(metadata.extensions)
    assert "system_shared_memory" in extensions and "cuda_shared_memory" not in extensions


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_client_shared_memory_is_off_unless_allowed(server, protocol):
    """As Triton since --allow-client-shm: a client could otherwise map any /dev/shm object the server may open."""
    c = client(server, protocol)
    with pytest.raises(InferenceServerException, match="Client shared memory is disabled") as refused:
        c.register_system_shared_memory("r", "/anything", 8)
    assert refused.value.status() in ("501", "StatusCode.UNIMPLEMENTED")
    metadata = c.get_server_metadata()
    extensions = metadata["extensions"] if protocol == "http" else list(metadata.extensions)
    assert "system_shared_memory" not in extensions


def test_unregistering_a_region_in_use_keeps_it_mapped_until_released(regions):
    """What a request holds (an input array viewing the region) stays readable after unregister; the
    mapping closes once the last view is gone, never under it."""
    key, handle = regions(64)
    shm.set_shared_memory_region(handle, [np.arange(16, dtype=np.int32)])
    registry = SharedMemoryRegistry(allowed=True)
    registry.register("r", key, 0, 64)
    region = registry.get("r")
    in_use = np.frombuffer(region.view(0, 64), dtype=np.int32)
    registry.unregister("r")
    assert registry.status() == [] and not region._map.closed  # still mapped: a request views it
    np.testing.assert_array_equal(in_use, np.arange(16))
    del in_use
    region.close()  # what the last user's release allows
    assert region._map.closed
