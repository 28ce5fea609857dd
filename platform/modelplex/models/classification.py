"""Triton's classification extension: a requested output with parameter `classification: k` goes
back as BYTES "value:index[:label]" strings, the k largest values of each batch row, labels read
from the output's `label_filename` in the model's folder when the model loads."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..core.errors import InvalidInput
from ..core.tensors import InferRequest, InferResponse, InferTensor
from .repository import confined

PARAMETER = "classification"
MAX_ELEMENTS = 1_000_000  # per row, as Triton bounds it: the sort would otherwise cost unbounded time
_SUPPORTED = frozenset({"UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP32", "FP64"})


def load_labels(config, model_path: Path) -> dict[str, list[str]]:
    """Each output's labels (one per line of its `label_filename`, a file inside the model's folder)."""
    labels = {}
    for output in config.output:
        if output.label_filename:
            path = confined(model_path, output.label_filename)
            try:
                labels[output.name] = path.read_text(encoding="utf-8").split("\n")
            except (OSError, UnicodeDecodeError) as e:
                raise InvalidInput(f"model '{config.name}': output '{output.name}' label_filename "
                                   f"'{output.label_filename}' cannot be read: {e}") from None
            if labels[output.name] and labels[output.name][-1] == "":
                labels[output.name].pop()  # the newline ending the last line
    return labels


def requested_classes(request: InferRequest) -> dict[str, int]:
    """Output name -> k for the outputs asked for as classifications (k 0 means not classified)."""
    found = {}
    for output in request.outputs:
        if output.parameters and PARAMETER in output.parameters:
            k = output.parameters[PARAMETER]
            if type(k) is not int or k < 0:
                raise InvalidInput(f"invalid value for 'classification' parameter of output '{output.name}', "
                                   f"expected a non-negative integer, got {k!r}")
            if k:
                found[output.name] = k
    return found


def classify(response: InferResponse, classes: dict[str, int], labels: dict[str, list[str]], batched: bool) -> None:
    """Replace each classified output of `response` by its top-k strings, shape [batch, k] ([k] unbatched)."""
    for i, tensor in enumerate(response.outputs):
        k = classes.get(tensor.name)
        if k is not None:
            response.outputs[i] = _top_k(tensor, k, labels.get(tensor.name, ()), batched)


def _top_k(tensor: InferTensor, k: int, labels, batched: bool) -> InferTensor:
    if tensor.datatype not in _SUPPORTED:
        raise InvalidInput(f"class result not available for output due to unsupported type '{tensor.datatype}'")
    data = np.asarray(tensor.data)
    rows = data.reshape(data.shape[0], -1) if batched and data.ndim > 0 else data.reshape(1, -1)
    if rows.shape[1] > MAX_ELEMENTS:
        raise InvalidInput("classification output tensor too large")
    k = min(k, rows.shape[1])
    as_text = "{:f}".format if tensor.datatype.startswith("FP") else "{:d}".format  # std::to_string's forms
    out = np.empty((rows.shape[0], k), dtype=np.object_)
    for r, row in enumerate(rows):
        # stable, largest first: ties keep index order, so the same input always gives the same answer
        for c, index in enumerate(np.argsort(-row.astype(np.float64), kind="stable")[:k]):
            text = f"{as_text(row[index].item())}:{index}"
            if index < len(labels) and labels[index]:
                text += f":{labels[index]}"
            out[r, c] = text.encode()
    if not (batched and data.ndim > 0):
        out = out.reshape(k)
    return InferTensor(tensor.name, "BYTES", list(out.shape), out)
