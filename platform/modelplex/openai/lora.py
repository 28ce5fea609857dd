"""vLLM's runtime LoRA routes, so existing tooling works: `POST /v1/load_lora_adapter` and
`POST /v1/unload_lora_adapter` over the data plane's adapter calls.

The body is vLLM's (`lora_name`, `lora_path`), plus an optional `model` naming the base model,
needed only when more than one text-generation model is loaded. Success answers vLLM's plain text.
"""
from __future__ import annotations

from fastapi import Request
from pydantic import Field
from starlette.responses import PlainTextResponse

from ..core.errors import NotFound
from ..dataplane import DataPlane
from .completions import RouteContext, read_request
from .errors import RequestError
from .models import is_llm, listed_models
from .schemas import OpenAIModel


class LoadLoRAAdapterRequest(OpenAIModel):
    lora_name: str = Field(min_length=1)
    lora_path: str = Field(min_length=1)
    load_inplace: bool = False
    model: str | None = None


class UnloadLoRAAdapterRequest(OpenAIModel):
    lora_name: str = Field(min_length=1)
    lora_int_id: int | None = None
    model: str | None = None


def base_model(dataplane: DataPlane, model: str | None) -> str:
    """The model an adapter loads onto: `model`, or the only loaded text-generation model that
    serves adapters."""
    if model is not None:
        return model
    llms = [name for name in listed_models(dataplane) if is_llm(dataplane, name) and dataplane.serves_adapters(name)]
    if len(llms) != 1:
        raise RequestError("model", f"name the base model in 'model' ({len(llms)} loaded text-generation models "
                                    f"serve adapters: {', '.join(llms) or 'none'})")
    return llms[0]


def add_routes(router, ctx: RouteContext) -> None:
    dataplane = ctx.dataplane

    @router.post("/v1/load_lora_adapter")
    async def load_lora_adapter(request: Request):
        body = await read_request(request, ctx, LoadLoRAAdapterRequest)
        if body.load_inplace:
            raise RequestError("load_inplace", "replacing a loaded adapter in place is not supported; unload it first")
        await dataplane.load_adapter(base_model(dataplane, body.model), body.lora_name, body.lora_path)
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' added successfully.")

    @router.post("/v1/unload_lora_adapter")
    async def unload_lora_adapter(request: Request):
        body = await read_request(request, ctx, UnloadLoRAAdapterRequest)
        model = body.model or dataplane.adapter_model(body.lora_name)
        if model is None:
            raise NotFound(f"LoRA adapter '{body.lora_name}' is not loaded")
        await dataplane.unload_adapter(model, body.lora_name)
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed successfully.")
