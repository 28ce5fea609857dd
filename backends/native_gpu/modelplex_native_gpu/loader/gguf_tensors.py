"""GGUF tensor storage: which types load, checks that each tensor's bytes are whole and inside the file, and
lazy sources for the quantized ones, read (with file reads, not through the reader's mmap, so the file's
pages never count as this process's memory) when the model takes them: one tensor at a time, straight
into its place, never expanded to fp32.
"""
from __future__ import annotations

import os

import numpy as np
import torch

from ..errors import ModelLoadError

FLOAT_TYPES = ("F32", "F16", "BF16")  # dequantized to fp32 at load, as before
QUANTIZED_TYPES = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q4_K", "Q5_K", "Q6_K")  # kept in their blocks
SUPPORTED_TYPES = FLOAT_TYPES + QUANTIZED_TYPES


def open_reader(path: str):
    """gguf.GGUFReader, its failures (a cut-off header or tensor table, a row that is not whole blocks, an
    unknown type number) as load errors naming the file."""
    import gguf

    try:
        return gguf.GGUFReader(path)
    except (ValueError, KeyError, IndexError, OSError) as e:
        size = os.path.getsize(path) if os.path.exists(path) else 0
        raise ModelLoadError(f"{path!r} ({size} bytes) is not a readable GGUF file: {e} "
                             f"(a truncated file, or a tensor whose size disagrees with its shape)") from e


def check_tensors(reader, path: str) -> None:
    """Every tensor of a supported type, with a whole number of blocks a row and its bytes inside the file,
    not running into the next tensor's; else a ModelLoadError naming the tensor and the problem."""
    import gguf

    size = os.path.getsize(path)
    for t in reader.tensors:
        if t.tensor_type.name not in SUPPORTED_TYPES:
            raise ModelLoadError(f"tensor {t.name!r} has GGUF type {t.tensor_type.name}, which this engine does not "
                                 f"load; supported types: {', '.join(SUPPORTED_TYPES)}")
        block, type_size = gguf.GGML_QUANT_SIZES[t.tensor_type]
        shape = [int(d) for d in t.shape]
        if shape[0] % block:
            raise ModelLoadError(f"tensor {t.name!r}: rows of {shape[0]} weights are not whole {t.tensor_type.name} "
                                 f"blocks of {block}")
        if t.data_offset + t.n_bytes > size:
            raise ModelLoadError(f"tensor {t.name!r} ({t.tensor_type.name}, shape {shape}, {t.n_bytes} bytes at offset "
                                 f"{t.data_offset}) runs past the end of the file ({size} bytes): truncated file")
    ordered = sorted(reader.tensors, key=lambda t: t.data_offset)
    for t, following in zip(ordered, ordered[1:]):
        if t.data_offset + t.n_bytes > following.data_offset:
            raise ModelLoadError(
                f"tensor {t.name!r}: shape {[int(d) for d in t.shape]} of {t.tensor_type.name} needs {t.n_bytes} "
                f"bytes, but the next tensor ({following.name!r}) starts {following.data_offset - t.data_offset} "
                f"bytes after it: its size disagrees with its shape")


def is_quantized(tensor) -> bool:
    return tensor.tensor_type.name in QUANTIZED_TYPES


class GGUFQuantizedTensor:
    """A quantized tensor left in the file: [rows, in_features] (GGUF's ne reversed), ggml's blocks along
    a row. `unpermute_heads` undoes llama.cpp's RoPE row permutation of attn_q/attn_k on the rows, which
    are whole rows of blocks, so it is exact on the quantized bytes too."""

    def __init__(self, path: str, tensor, unpermute_heads: int | None = None):
        self.path = path
        self.name = tensor.name
        self.qtype = int(tensor.tensor_type)
        self.type_name = tensor.tensor_type.name
        dims = [int(d) for d in tensor.shape]
        self.shape = (int(np.prod(dims[1:])), dims[0])
        self.offset, self.n_bytes = int(tensor.data_offset), int(tensor.n_bytes)
        self.unpermute_heads = unpermute_heads

    def unpermuted(self, n_head: int) -> GGUFQuantizedTensor:
        out = GGUFQuantizedTensor.__new__(GGUFQuantizedTensor)
        out.__dict__.update(self.__dict__, unpermute_heads=n_head)
        return out

    def read_into(self, out: torch.Tensor) -> None:
        """Fill `out` (uint8 [rows, row bytes], contiguous) with the tensor's bytes."""
        assert out.is_contiguous() and out.numel() == self.n_bytes, (out.shape, self.n_bytes)
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            got = f.readinto(memoryview(out.numpy()).cast("B"))
        if got != self.n_bytes:
            raise ModelLoadError(f"tensor {self.name!r}: read {got} of {self.n_bytes} bytes: truncated file")
        if self.unpermute_heads:
            rows = out.shape[0]
            out.copy_(out.view(self.unpermute_heads, rows // self.unpermute_heads // 2, 2, -1)
                      .transpose(1, 2).reshape(out.shape))

    def dequantize(self) -> torch.Tensor:
        """fp32 [rows, in_features] (gguf.quants.dequantize): for devices without the quantized kernels."""
        import gguf

        from ..layers.quantized import row_bytes

        raw = torch.empty(self.shape[0], row_bytes(self.qtype, self.shape[1]), dtype=torch.uint8)
        self.read_into(raw)
        w = gguf.quants.dequantize(raw.numpy(), gguf.GGMLQuantizationType(self.qtype))
        return torch.from_numpy(np.ascontiguousarray(w, dtype=np.float32).reshape(self.shape))
