"""vLLM's server routes beside the OpenAI ones: `GET /health`, `GET|POST /ping` (SageMaker), `GET /version`,
`POST /tokenize` and `POST /detokenize` (vLLM's bodies and answers), over the data plane."""
from __future__ import annotations

from typing import Any

from fastapi import Request
from pydantic import Field
from starlette.responses import Response

from .. import __version__
from ..core.errors import Unavailable
from ..dataplane import DataPlane
from ..http.routes import json_response
from ..llm.tensor_protocol import GenerateInputs, chat_request
from .completions import RouteContext, read_request
from .errors import RequestError
from .models import is_llm, listed_models, max_model_len, resolve_model
from .schemas import OpenAIModel


class TokenizeRequest(OpenAIModel):
    model: str | None = None
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    return_token_strs: bool = False

    def inputs(self) -> GenerateInputs:
        if (self.prompt is None) == (self.messages is None):
            raise RequestError("prompt", "give exactly one of prompt and messages")
        if self.prompt is not None:
            return GenerateInputs(self.prompt, None, {})
        chat = chat_request({"messages": self.messages, "tools": self.tools, "chat_template": self.chat_template,
                             "chat_template_kwargs": self.chat_template_kwargs or {},
                             "add_generation_prompt": self.add_generation_prompt,
                             "continue_final_message": self.continue_final_message})
        return GenerateInputs(None, chat, {})


class DetokenizeRequest(OpenAIModel):
    model: str | None = None
    tokens: list[int] = Field(min_length=1)


def llm_model(dataplane: DataPlane, name: str | None) -> str:
    """`name` (a model or adapter), or the only text-generation model loaded."""
    if name is not None:
        return resolve_model(dataplane, name)[0]
    llms = [m for m in listed_models(dataplane) if is_llm(dataplane, m)]
    if len(llms) != 1:
        raise RequestError("model", f"name the model ({len(llms)} text-generation models are loaded)")
    return llms[0]


def add_routes(router, ctx: RouteContext) -> None:
    dataplane = ctx.dataplane

    # vLLM's /health says the server is alive (its engine runs), not that every model loaded: a model
    # that failed shows on /v2/health/ready and /v1/models instead.
    @router.get("/health")
    async def health():
        if not dataplane.accepting:
            raise Unavailable("the server is shutting down")
        return Response(status_code=200)

    @router.get("/ping")
    @router.post("/ping")
    async def ping():
        if not dataplane.accepting:
            raise Unavailable("the server is shutting down")
        return json_response({})

    @router.get("/version")
    async def version():
        return json_response({"version": __version__})

    @router.post("/tokenize")
    async def tokenize(request: Request):
        body = await read_request(request, ctx, TokenizeRequest)
        model = llm_model(dataplane, body.model)
        tokens = await dataplane.tokenize(model, body.inputs(), body.add_special_tokens)
        strs = [await dataplane.detokenize(model, [t]) for t in tokens] if body.return_token_strs else None
        return json_response({"count": len(tokens), "max_model_len": max_model_len(dataplane, model),
                              "tokens": tokens, "token_strs": strs})

    @router.post("/detokenize")
    async def detokenize(request: Request):
        body = await read_request(request, ctx, DetokenizeRequest)
        model = llm_model(dataplane, body.model)
        return json_response({"prompt": await dataplane.detokenize(model, body.tokens)})
