"""Writing GGUF files tensor by tensor (only one tensor in memory at a time): another file's metadata with
its weights requantized (the tests' Q8_0/Q4_0 SmolLM2, the example repository's `smollm2_q8`), or tensors
made by a callback (benchmarks/make_gguf.py's random models).
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

_WRITER_KEYS = ("GGUF.", "general.architecture")  # written by GGUFWriter itself


@dataclass
class TensorPlan:
    """One tensor to write: its name, numpy-order shape ([rows, cols]), GGML type name and a callback that
    returns its data: fp32 values (quantized on the way) or, for `raw`, the type's bytes."""

    name: str
    shape: tuple[int, ...]
    type_name: str
    make: Callable[[], np.ndarray]
    raw: bool = False


def copy_metadata(reader, writer, skip: Callable[[str], bool] = lambda key: False) -> None:
    """Every key/value of `reader` (gguf.GGUFReader) into `writer`, with its GGUF value types."""
    import gguf

    for key, field in reader.fields.items():
        if key.startswith(_WRITER_KEYS) or key == "general.file_type" or skip(key):
            continue
        vtype = field.types[0]
        sub_type = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), vtype, sub_type)


def write(path: str, arch: str, plans: Iterable[TensorPlan], metadata: Callable[[object], None]) -> None:
    """Write `plans` to `path`; `metadata(writer)` adds the key/values."""
    import gguf

    plans = list(plans)
    writer = gguf.GGUFWriter(path, arch)
    metadata(writer)
    for p in plans:
        qtype = gguf.GGMLQuantizationType[p.type_name]
        block, type_size = gguf.GGML_QUANT_SIZES[qtype]
        nbytes = int(np.prod(p.shape)) // block * type_size
        writer.add_tensor_info(p.name, p.shape, np.dtype(np.float32), nbytes, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for p in plans:
        qtype = gguf.GGMLQuantizationType[p.type_name]
        data = p.make()
        if not p.raw:
            data = gguf.quants.quantize(np.ascontiguousarray(data, dtype=np.float32), qtype)
        writer.write_tensor_data(np.ascontiguousarray(data))
    writer.close()


def requantize(src: str, dst: str, type_name: str) -> None:
    """`src` with every 2-D tensor whose rows are whole blocks of `type_name` requantized to it from its
    dequantized values (norms and other tensors copied as they are)."""
    import gguf

    reader = gguf.GGUFReader(src)
    qtype = gguf.GGMLQuantizationType[type_name]
    block = gguf.GGML_QUANT_SIZES[qtype][0]

    def plan(t) -> TensorPlan:
        shape = tuple(int(d) for d in reversed(t.shape))
        if len(shape) == 2 and shape[1] % block == 0:
            return TensorPlan(t.name, shape, type_name,
                              lambda: gguf.quants.dequantize(t.data, t.tensor_type).reshape(shape))
        return TensorPlan(t.name, shape, t.tensor_type.name, lambda: np.asarray(t.data), raw=True)

    arch = str(reader.fields["general.architecture"].contents())
    write(dst, arch, [plan(t) for t in reader.tensors], lambda writer: copy_metadata(reader, writer))
