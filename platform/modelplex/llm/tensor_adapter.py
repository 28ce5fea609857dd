"""The KServe tensor form of text generation (`tensor_protocol`), adapted onto the typed contract: a
tensor request becomes `GenerateInputs`, and `TextChunk`s become protocol responses (`text_output` and
response parameters; a Triton vLLM-backend model's flag tensors add its output tensors, see
`vllm_tensors`). Used by the data plane for every tensor door (HTTP infer, gRPC infer and stream,
the generate extension), so tritonclient users keep the wire form they know. The other way round,
a model that speaks only the tensor form (a Python-backend LLM) serves `DataPlane.generate` through
`tensor_request` and `text_chunk`.
"""
from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass, replace

import numpy as np

from ..core.errors import InvalidInput
from ..core.tensors import InferRequest, InferResponse, InferTensor
from ..models.adapters import LORA_PARAMETER
from .contract import TextChunk, TokenLogprob
from .tensor_protocol import (
    TOKEN_IDS_PARAMETER,
    USAGE_PARAMETER,
    GenerateInputs,
    read_generate_inputs,
    text_response,
)
from .vllm_tensors import VllmFlags, is_vllm_model


@dataclass
class TensorForm:
    """How one tensor request wants its answers."""

    request: InferRequest
    model: tuple[str, str]
    num_completions: int
    usage_per_response: bool
    vllm: VllmFlags | None = None  # a Triton vLLM-backend model's flags
    hidden_parameters: tuple[str, ...] = ()  # computed only for an output tensor


def read_request(request: InferRequest, model: tuple[str, str], config) -> tuple[GenerateInputs, TensorForm]:
    """The request's inputs and how to answer it; InvalidInput names the field at fault."""
    inputs = read_generate_inputs(request)
    lora_name = inputs.sampling.pop("lora_name", None)  # Triton's vLLM backend names the adapter there
    if lora_name is not None and not isinstance(lora_name, str):
        raise InvalidInput("lora_name: must be a string", param="lora_name")
    if lora_name and not inputs.lora:
        inputs.lora, inputs.lora_field = lora_name, "lora_name"
    inputs.request_id = request.id
    n = inputs.sampling.get("n", 1)
    form = TensorForm(request, model, n if isinstance(n, int) else 1, bool(request.parameters.get(USAGE_PARAMETER)))
    if is_vllm_model(config):
        form.vllm = VllmFlags.read(request)
        if form.vllm.values.get("return_cumulative_logprob") and inputs.sampling.get("logprobs") is None:
            inputs.sampling["logprobs"] = 0  # the sampled tokens' log-probabilities, summed per completion
            form.hidden_parameters = ("logprobs",)
    return inputs, form


async def responses(form: TensorForm, inputs: GenerateInputs,
                    chunks: AsyncIterator[TextChunk]) -> AsyncIterator[InferResponse]:
    """A stream's responses: one per chunk, or (a vLLM-backend model without `stream`) one per completion."""
    async with contextlib.aclosing(chunks):
        if form.vllm is not None and not form.vllm.stream:
            async for response in _whole_per_completion(form, inputs, chunks):
                yield response
            return
        async for chunk in chunks:
            yield _response(form, chunk.text, chunk)


async def one_response(form: TensorForm, chunks: AsyncIterator[TextChunk]) -> InferResponse:
    """A non-decoupled model's one answer: the completion's chunks joined."""
    if form.num_completions > 1:
        raise InvalidInput("n: more than one completion per request needs a decoupled model", param="n")
    parts: list[TextChunk] = []
    async with contextlib.aclosing(chunks):
        async for chunk in chunks:
            parts.append(chunk)
    if not parts:
        raise InvalidInput(f"model '{form.model[0]}' sent no response")
    whole = joined(parts)
    return _response(form, whole.text, whole)


def joined(parts: list[TextChunk]) -> TextChunk:
    """One completion's chunks as one: texts, token ids and log-probabilities concatenated, the last
    one's finish and counts, the first phases reported."""
    logprobs = None if all(p.logprobs is None for p in parts) else [e for p in parts for e in p.logprobs or ()]
    prompt_logprobs = next((p.prompt_logprobs for p in parts if p.prompt_logprobs is not None), None)
    return replace(parts[-1], text="".join(p.text for p in parts), token_ids=[t for p in parts for t in p.token_ids],
                   logprobs=logprobs, prompt_logprobs=prompt_logprobs,
                   phases=next((p.phases for p in parts if p.phases), None))


async def _whole_per_completion(form: TensorForm, inputs: GenerateInputs,
                                chunks: AsyncIterator[TextChunk]) -> AsyncIterator[InferResponse]:
    """Triton's vLLM backend without `stream`: one response per completion, the prompt first unless
    `exclude_input_in_output`."""
    parts: dict[int, list[TextChunk]] = {}
    async for chunk in chunks:
        parts.setdefault(chunk.index, []).append(chunk)
        if chunk.finished:
            whole = joined(parts.pop(chunk.index))
            prefix = (inputs.text or "") if form.vllm.prepend_input else ""
            yield _response(form, prefix + whole.text, whole)


def _response(form: TensorForm, text: str, chunk: TextChunk) -> InferResponse:
    parameters: dict = {}
    if form.num_completions > 1:
        parameters["index"] = chunk.index
    if chunk.finished:
        parameters.update(finish_reason=chunk.finish_reason, num_input_tokens=chunk.num_prompt_tokens,
                          num_output_tokens=chunk.num_output_tokens)
    elif form.usage_per_response:
        parameters.update(num_input_tokens=chunk.num_prompt_tokens, num_output_tokens=chunk.num_output_tokens)
    if chunk.logprobs is not None:
        parameters["logprobs"] = json.dumps([logprob_entry(e, False) for e in chunk.logprobs])
    if chunk.prompt_logprobs is not None:
        parameters["prompt_logprobs"] = json.dumps([logprob_entry(e, True) for e in chunk.prompt_logprobs])
    response = text_response(form.request, form.model, text, parameters)
    response.phases = chunk.phases
    if form.vllm is not None:
        tensors = form.vllm.outputs(chunk)
        response.outputs += tensors
        for name in (*(t.name for t in tensors), *form.hidden_parameters):
            parameters.pop(name, None)  # the tensors carry vLLM's meaning
    return response


def logprob_entry(entry: TokenLogprob, with_id: bool) -> dict:
    """The protocol's JSON of one token: `{token, logprob, top_logprobs}` (and `token_id`, for the prompt's)."""
    return {**_token(entry, with_id), "top_logprobs": [_token(t, with_id) for t in entry.top]}


def _token(entry: TokenLogprob, with_id: bool) -> dict:
    if with_id:
        return {"token": entry.token, "token_id": entry.token_id, "logprob": entry.logprob}
    return {"token": entry.token, "logprob": entry.logprob}


# ---- the other way: a model that speaks only the tensor form (a Python-backend LLM) ------------
def tensor_request(inputs: GenerateInputs, model: str, version: str, declared: set[str],
                   batching: bool) -> InferRequest:
    """`inputs` as the tensor form's request, for a model without `generate`: one-element BYTES tensors
    (a batch dimension when the model batches); Triton's vLLM-backend `stream` and
    `exclude_input_in_output` true where declared (deltas without the prompt, as Triton's OpenAI
    frontend sends them); token counts on every response."""
    shape = (1, 1) if batching else (1,)
    tensors = [_bytes("sampling_parameters", json.dumps(inputs.sampling), shape)]
    parameters: dict = {USAGE_PARAMETER: True}
    if inputs.chat is not None:
        tensors.append(_bytes("messages", json.dumps(asdict(inputs.chat)), shape))
    elif inputs.prompt_token_ids is not None:
        parameters[TOKEN_IDS_PARAMETER] = json.dumps(inputs.prompt_token_ids)
    else:
        tensors.append(_bytes("text_input", inputs.text or "", shape))
    for flag in ("stream", "exclude_input_in_output"):
        if flag in declared:
            tensors.append(InferTensor.from_numpy(flag, np.array([True]).reshape(shape)))
    if inputs.lora:
        parameters[LORA_PARAMETER] = inputs.lora
    return InferRequest(model, tensors, version, inputs.request_id, parameters=parameters)


def text_chunk(response: InferResponse) -> TextChunk:
    """One tensor-form response as a chunk (its `text_output` and response parameters)."""
    params = response.parameters
    text = next((t.data.reshape(-1)[0] for t in response.outputs if t.name == "text_output" and t.data.size), b"")
    chunk = TextChunk(text.decode(errors="replace") if isinstance(text, bytes) else str(text),
                      index=int(params.get("index", 0)), finish_reason=params.get("finish_reason") or None,
                      num_prompt_tokens=int(params.get("num_input_tokens", 0)),
                      num_output_tokens=int(params.get("num_output_tokens", 0)))
    if "logprobs" in params:
        chunk.logprobs = [_entry(e) for e in json.loads(params["logprobs"])]
    if "prompt_logprobs" in params:
        chunk.prompt_logprobs = [_entry(e) for e in json.loads(params["prompt_logprobs"])]
    return chunk


def _entry(entry: dict) -> TokenLogprob:
    return TokenLogprob(entry["token"], entry["logprob"], entry.get("token_id"),
                        tuple(_entry(t) for t in entry.get("top_logprobs", ())))


def _bytes(name: str, text: str, shape: tuple) -> InferTensor:
    return InferTensor.from_numpy(name, np.array([text.encode()], dtype=np.object_).reshape(shape))
