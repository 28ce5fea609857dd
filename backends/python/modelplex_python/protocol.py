"""The framed protocol between the server and a Python worker process, over a Unix socket.

A frame is `u32 header length | JSON header | buffers`; the header lists the buffers' sizes under
`"_sizes"`. A tensor travels as `{"name", "datatype", "shape", "buffer"}` plus one raw buffer:
the array's C-order bytes, or for BYTES each element as a u32 length and its bytes (Triton's own
serialisation). Only numpy and the standard library are imported here: the worker starts fast.
"""
from __future__ import annotations

import json
import socket
import struct
import threading

import numpy as np

_U32 = struct.Struct("<I")

TRITON_TO_NUMPY = {
    "BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
    "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64,
    "FP16": np.float16, "FP32": np.float32, "FP64": np.float64, "BYTES": np.object_,
}
NUMPY_TO_TRITON = {np.dtype(v): k for k, v in TRITON_TO_NUMPY.items()}


class ChannelClosed(Exception):
    """The other end of the socket went away (the worker died, or the server did)."""


def triton_datatype(array: np.ndarray) -> str:
    """The Triton datatype of a numpy array; ValueError for dtypes Triton has no name for."""
    if array.dtype.kind in "SUO":
        return "BYTES"
    try:
        return NUMPY_TO_TRITON[array.dtype]
    except KeyError:
        raise ValueError(f"numpy dtype {array.dtype} has no Triton datatype") from None


def serialize_bytes(array: np.ndarray) -> bytes:
    """Each element as u32 length + bytes (str elements as UTF-8), in C order."""
    parts = []
    for item in array.flat:
        data = item.encode() if isinstance(item, str) else bytes(item)
        parts += [_U32.pack(len(data)), data]
    return b"".join(parts)


def deserialize_bytes(buffer, shape) -> np.ndarray:
    items, offset, view = [], 0, memoryview(buffer)
    while offset < len(view):
        (length,) = _U32.unpack_from(view, offset)
        items.append(bytes(view[offset + 4:offset + 4 + length]))
        offset += 4 + length
    array = np.empty(len(items), dtype=np.object_)
    array[:] = items
    return array.reshape(shape)


def encode_tensor(name: str, array: np.ndarray, buffers: list) -> dict:
    """Describe `array` for a header and append its payload to `buffers`."""
    datatype = triton_datatype(array)
    payload = serialize_bytes(array) if datatype == "BYTES" else np.ascontiguousarray(array).data
    buffers.append(payload)
    return {"name": name, "datatype": datatype, "shape": list(array.shape), "buffer": len(buffers) - 1}


def decode_tensor(desc: dict, buffers: list) -> np.ndarray:
    buffer = buffers[desc["buffer"]]
    if desc["datatype"] == "BYTES":
        return deserialize_bytes(buffer, desc["shape"])
    # The buffer is a slice of a bytearray, so the array is writable, as user code may expect.
    return np.frombuffer(buffer, dtype=TRITON_TO_NUMPY[desc["datatype"]]).reshape(desc["shape"])


class Channel:
    """One end of the socket: whole frames out (any thread, serialised by a lock), whole frames in
    (one reading thread)."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self._send_lock = threading.Lock()

    def send(self, header: dict, buffers: list = ()) -> None:
        with self._send_lock:
            for chunk in frame(header, buffers):
                self.sock.sendall(chunk)

    def receive(self) -> tuple[dict, list]:
        (length,) = _U32.unpack(self._read(4))
        header = json.loads(self._read(length))
        sizes = header.pop("_sizes", [])
        data = self._read(sum(sizes)) if sizes else bytearray()
        view, buffers, offset = memoryview(data), [], 0
        for size in sizes:
            buffers.append(view[offset:offset + size])
            offset += size
        return header, buffers

    def _read(self, size: int) -> bytearray:
        data = bytearray(size)
        view, got = memoryview(data), 0
        while got < size:
            try:
                n = self.sock.recv_into(view[got:])
            except ConnectionError as e:  # closed with our frames still unread on its side: a reset, not EOF
                raise ChannelClosed(f"the other end closed the channel ({e})") from e
            if n == 0:
                raise ChannelClosed("the other end closed the channel")
            got += n
        return data

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


def frame(header: dict, buffers=()) -> list:
    """The chunks of one frame, ready to write in order."""
    sizes = [memoryview(b).nbytes for b in buffers]
    text = json.dumps(header | {"_sizes": sizes} if sizes else header, default=str).encode()
    return [_U32.pack(len(text)) + text, *buffers]
