"""`POST /v1/embeddings`: texts through an embedding model (one BYTES input, an FP32 output), in
batches of the model's max_batch_size, as floats or base64 of little-endian float32."""
from __future__ import annotations

import base64

import numpy as np
from fastapi import Request

from ..core.tensors import InferRequest, InferTensor
from ..dataplane import DataPlane
from ..http.routes import json_response
from .completions import RouteContext, read_request
from .errors import RequestError
from .models import EmbeddingModel, require_embedding_model
from .schemas import EmbeddingRequest


async def embed(dataplane: DataPlane, model: EmbeddingModel, texts: list[str]) -> np.ndarray:
    """[len(texts), dim] float32, one data-plane request per batch."""
    step = max(1, model.max_batch_size)
    rows = []
    for start in range(0, len(texts), step):
        chunk = texts[start:start + step]
        data = np.array([t.encode() for t in chunk], dtype=np.object_)
        shape = (len(chunk),) + (1,) * model.input_rank if model.max_batch_size > 0 else (1,) * model.input_rank
        request = InferRequest(model.name, [InferTensor.from_numpy(model.input_name, data.reshape(shape))])
        response = await dataplane.infer(request)
        (vectors,) = [t.data for t in response.outputs if t.name == model.output_name]
        rows.append(np.asarray(vectors, dtype=np.float32).reshape(len(chunk), -1))
    return np.concatenate(rows)


def add_routes(router, ctx: RouteContext) -> None:
    dataplane = ctx.dataplane

    @router.post("/v1/embeddings")
    async def embeddings(request: Request):
        body = await read_request(request, ctx, EmbeddingRequest)
        model = require_embedding_model(dataplane, body.model)
        texts = body.texts()
        vectors = await embed(dataplane, model, texts)
        if body.dimensions is not None and body.dimensions != vectors.shape[1]:
            raise RequestError("dimensions", f"model '{body.model}' gives {vectors.shape[1]} dimensions only")
        data = [{"object": "embedding", "index": i,
                 "embedding": (base64.b64encode(v.astype("<f4").tobytes()).decode() if body.encoding_format == "base64"
                               else v.tolist())} for i, v in enumerate(vectors)]
        # Token counts stay 0: the embedding model's tokenizer runs inside it, out of sight.
        return json_response({"object": "list", "data": data, "model": body.model,
                              "usage": {"prompt_tokens": 0, "total_tokens": 0}})
