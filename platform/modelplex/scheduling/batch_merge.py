"""Several requests of a batching model as one: inputs concatenated along dim 0, outputs split back.

The dynamic batcher groups requests whose inputs share names, datatypes and non-batch shapes; for a
backend that declares `BackendSpec.merges_batches` it hands `execute` one request holding all their
rows, so one run (one ONNX Runtime / OpenVINO call) serves them all.
"""
from __future__ import annotations

import numpy as np

from ..core.errors import InternalError
from ..core.tensors import InferRequest, InferResponse, InferTensor, RequestedOutput


def merge_requests(requests: list[InferRequest]) -> InferRequest:
    """One request holding every request's rows (in order), asking for every output any of them asks
    for (all outputs when one of them names none). The caller guarantees matching input signatures."""
    first = requests[0]
    inputs = [InferTensor(t.name, t.datatype, [sum(r.input(t.name).shape[0] for r in requests), *t.shape[1:]],
                          np.concatenate([r.input(t.name).data for r in requests]))
              for t in first.inputs]
    if any(not r.outputs for r in requests):
        outputs = []
    else:
        outputs = [RequestedOutput(name) for name in dict.fromkeys(o.name for r in requests for o in r.outputs)]
    return InferRequest(first.model_name, inputs, first.model_version, first.id, outputs)


def split_response(merged: InferResponse, requests: list[InferRequest]) -> list[InferResponse]:
    """Each request's rows of `merged`, with the outputs it asked for (all of them when it named none)."""
    total = sum(r.inputs[0].shape[0] for r in requests)
    for t in merged.outputs:
        if not t.shape or t.shape[0] != total:
            raise InternalError(f"model '{requests[0].model_name}' returned output '{t.name}' of shape {t.shape} "
                                f"for a merged batch of {total} rows")
    responses, start = [], 0
    for request in requests:
        end = start + request.inputs[0].shape[0]
        wanted = {o.name for o in request.outputs}
        outputs = [InferTensor(t.name, t.datatype, [end - start, *t.shape[1:]], t.data[start:end])
                   for t in merged.outputs if not wanted or t.name in wanted]
        responses.append(InferResponse(merged.model_name, merged.model_version, outputs))
        start = end
    return responses
