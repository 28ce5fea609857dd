"""A worker's calls into the server: BLS inference and model control, served through the host's data
plane and answered over the worker's channel."""
from __future__ import annotations

import logging

from modelplex import (
    InferRequest,
    InferResponse,
    InferTensor,
    InvalidInput,
    ModelplexError,
    NotFound,
    RequestedOutput,
    Unavailable,
    Unsupported,
)

from .protocol import decode_tensor, encode_tensor

log = logging.getLogger(__name__)
# The host's errors -> pb_utils.TritonError codes (INTERNAL for anything else).
CODES = {InvalidInput: 3, NotFound: 2, Unavailable: 4, Unsupported: 5}
INTERNAL = 1


def bls_request(desc: dict, buffers: list) -> InferRequest:
    inputs = [InferTensor(t["name"], t["datatype"], t["shape"], decode_tensor(t, buffers)) for t in desc["inputs"]]
    version = desc.get("model_version", -1)
    return InferRequest(desc["model_name"], inputs, model_version=str(version) if version >= 0 else "",
                        id=desc.get("id", ""), outputs=[RequestedOutput(n) for n in desc.get("outputs", [])],
                        parameters=desc.get("parameters") or {})


def _response(response: InferResponse, buffers: list) -> dict:
    return {"outputs": [encode_tensor(t.name, t.data, buffers) for t in response.outputs],
            "parameters": response.parameters}


async def serve_bls(dataplane, worker, header: dict, buffers: list) -> None:
    """Run one BLS call; the worker gets one reply (or, decoupled, one per response) and a final flag.
    Failures go back as a TritonError in the response, as Triton's `exec()` reports them."""
    call_id = header["id"]
    try:
        if dataplane is None:
            raise Unsupported("BLS needs the host to give backends its data plane (ModelContext.dataplane)")
        request = bls_request(header["request"], buffers)
        if header["decoupled"]:
            async for response in dataplane.stream(request):
                out: list = []
                worker.send({"op": "bls_response", "id": call_id, "final": False,
                             "response": _response(response, out)}, out)
            worker.send({"op": "bls_response", "id": call_id, "final": True, "response": None})
        else:
            response = await dataplane.infer(request)
            out = []
            worker.send({"op": "bls_response", "id": call_id, "final": True, "response": _response(response, out)},
                        out)
    except Exception as e:
        if not isinstance(e, ModelplexError):
            log.exception("BLS call from a python model failed")
        code = next((c for cls, c in CODES.items() if isinstance(e, cls)), INTERNAL)
        message = e.message if isinstance(e, ModelplexError) else f"{type(e).__name__}: {e}"
        worker.send({"op": "bls_response", "id": call_id, "final": True,
                     "response": {"error": {"message": message, "code": code}}})


async def serve_control(dataplane, worker, header: dict, buffers: list) -> None:
    """pb_utils.load_model / unload_model / is_model_ready; the worker gets the result or the error text."""
    reply = {"op": "control_response", "id": header["id"]}
    arguments = header["arguments"]
    try:
        if dataplane is None:
            raise Unsupported("model control needs the host to give backends its data plane")
        if header["action"] == "load":
            files = {path: bytes(buffer) for path, buffer in zip(header["files"], buffers)}
            await dataplane.load_model(arguments["model_name"], arguments["config"], files or None)
        elif header["action"] == "unload":
            await dataplane.unload_model(arguments["model_name"], arguments["unload_dependents"])
        else:
            reply["result"] = dataplane.model_ready(arguments["model_name"], arguments["model_version"])
    except Exception as e:
        reply["error"] = e.message if isinstance(e, ModelplexError) else f"{type(e).__name__}: {e}"
    worker.send(reply)
