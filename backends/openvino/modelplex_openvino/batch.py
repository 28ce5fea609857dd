"""Several requests of a batching model as one: inputs concatenated along dim 0, outputs split back.

The dynamic batcher hands `execute` requests whose non-batch shapes match; one run over all of them
uses the device better than one run each. (The ONNX backend merges the same way inside its instance;
both belong in the host.)
"""
from __future__ import annotations

import numpy as np
from modelplex import InferRequest, InferResponse, InferTensor, RequestedOutput


def merge_requests(requests: list[InferRequest], max_batch_size: int, all_outputs: list[str]) -> InferRequest | None:
    """One request holding every request's rows, asking for every output any of them asks for; None
    when they cannot share a run (their non-batch shapes or input names differ, or too many rows)."""
    shapes = {t.name: t.data.shape[1:] for t in requests[0].inputs}
    if any({t.name: t.data.shape[1:] for t in r.inputs} != shapes for r in requests[1:]):
        return None
    if sum(r.inputs[0].data.shape[0] for r in requests) > max_batch_size:
        return None
    inputs = [InferTensor.from_numpy(name, np.concatenate([r.input(name).data for r in requests]))
              for name in shapes]
    wanted = dict.fromkeys(o.name for r in requests for o in (r.outputs or [RequestedOutput(n) for n in all_outputs]))
    return InferRequest(requests[0].model_name, inputs, outputs=[RequestedOutput(name) for name in wanted])


def split_response(merged: InferResponse, requests: list[InferRequest]) -> list[InferResponse]:
    """Each request's rows of `merged`, with the outputs it asked for (all of them when it named none)."""
    responses, start = [], 0
    for request in requests:
        end = start + request.inputs[0].data.shape[0]
        wanted = {o.name for o in request.outputs}
        outputs = [InferTensor(t.name, t.datatype, [end - start, *t.shape[1:]], t.data[start:end])
                   for t in merged.outputs if not wanted or t.name in wanted]
        responses.append(InferResponse(merged.model_name, merged.model_version, outputs))
        start = end
    return responses
