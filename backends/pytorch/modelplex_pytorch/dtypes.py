"""Triton datatypes <-> torch dtypes. BYTES has no torch tensor type: the backend refuses it at load."""
from __future__ import annotations

import torch

TRITON_TO_TORCH = {
    "BOOL": torch.bool,
    "UINT8": torch.uint8,
    "UINT16": torch.uint16,
    "UINT32": torch.uint32,
    "UINT64": torch.uint64,
    "INT8": torch.int8,
    "INT16": torch.int16,
    "INT32": torch.int32,
    "INT64": torch.int64,
    "FP16": torch.float16,
    "FP32": torch.float32,
    "FP64": torch.float64,
}
TORCH_TO_TRITON = {v: k for k, v in TRITON_TO_TORCH.items()}


def triton_datatype(dtype: torch.dtype) -> str:
    """The Triton datatype of a torch dtype, "" when modelplex cannot carry it (bfloat16, complex)."""
    return TORCH_TO_TRITON.get(dtype, "")
