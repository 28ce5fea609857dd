"""Which loaded models the OpenAI routes may use, read from the data plane's metadata.

A text-generation model takes a BYTES `text_input` and is decoupled (it streams); an embedding
model takes one BYTES input and returns an FP32 tensor. Anything else is not listed.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..core.errors import NotFound, Unavailable
from ..dataplane import DataPlane
from .errors import RequestError


@dataclass(frozen=True)
class EmbeddingModel:
    name: str
    input_name: str
    input_rank: int  # dims after the batch dimension
    output_name: str
    max_batch_size: int


def is_llm(dataplane: DataPlane, name: str) -> bool:
    metadata = dataplane.model_metadata(name)
    takes_text = any(t["name"] == "text_input" and t["datatype"] == "BYTES" for t in metadata["inputs"])
    return takes_text and dataplane.model_config(name).model_transaction_policy.decoupled


def embedding_model(dataplane: DataPlane, name: str) -> EmbeddingModel | None:
    metadata = dataplane.model_metadata(name)
    texts = [t for t in metadata["inputs"] if t["datatype"] == "BYTES"]
    vectors = [t for t in metadata["outputs"] if t["datatype"] == "FP32"]
    if len(metadata["inputs"]) != 1 or len(texts) != 1 or not vectors:
        return None
    max_batch_size = dataplane.model_config(name).max_batch_size
    rank = len(texts[0]["shape"]) - (1 if max_batch_size > 0 else 0)
    return EmbeddingModel(name, texts[0]["name"], rank, vectors[0]["name"], max_batch_size)


def require_llm(dataplane: DataPlane, name: str) -> None:
    """NotFound (404) for an unknown model, RequestError for a model that does not generate text."""
    if not is_llm(dataplane, name):
        raise RequestError("model", f"model '{name}' is not a text-generation model (a decoupled model with a "
                                    "BYTES text_input)")


def require_embedding_model(dataplane: DataPlane, name: str) -> EmbeddingModel:
    model = embedding_model(dataplane, name)
    if model is None:
        raise RequestError("model", f"model '{name}' is not an embedding model (one BYTES input, an FP32 output)")
    return model


def resolve_model(dataplane: DataPlane, name: str) -> tuple[str, str | None]:
    """The OpenAI `model` field as (model, adapter): a model's name, or a LoRA adapter's name, which
    runs its base model with that adapter. Neither: NotFound (404)."""
    if dataplane.has_model(name):
        return name, None
    model = dataplane.adapter_model(name)
    if model is None:
        raise NotFound(f"model '{name}' is not found")
    return model, name


def model_parameter(dataplane: DataPlane, name: str, key: str) -> str | None:
    """A config.pbtxt `parameters` value of a loaded model (e.g. `tool_call_parser`)."""
    parameters = dataplane.model_config(name).parameters
    return parameters[key].string_value if key in parameters else None


def max_model_len(dataplane: DataPlane, name: str) -> int | None:
    """The context length an LLM's engine reports (None when it reports none)."""
    try:
        stats = dataplane.engine_stats(name)
    except (NotFound, Unavailable):
        return None
    return next((s["max_model_len"] for s in stats if s.get("max_model_len")), None)


def listed_adapters(dataplane: DataPlane, models: list[str]) -> list[tuple[str, str]]:
    """(adapter, base model) of every adapter the listed models serve."""
    found = []
    for model in models:
        try:
            found += [(row["name"], model) for row in dataplane.list_adapters(model)]
        except (NotFound, Unavailable):  # unloaded since the index was read
            continue
    return found


def listed_models(dataplane: DataPlane) -> list[str]:
    """Ready models the OpenAI routes can serve, by name."""
    names = sorted({entry["name"] for entry in dataplane.repository_index(ready_only=True)})
    listed = []
    for name in names:
        try:
            if is_llm(dataplane, name) or embedding_model(dataplane, name) is not None:
                listed.append(name)
        except NotFound:  # unloaded since the index was read
            continue
    return listed
