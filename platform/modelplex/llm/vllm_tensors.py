"""Triton's vLLM-backend request flags (`src/model.py` of that backend): optional BOOL tensors `stream`
(absent: one response per completion with the whole text), `exclude_input_in_output` (absent and not
streaming: the prompt comes first), `return_finish_reason`, `return_cumulative_logprob`,
`return_num_input_tokens`, `return_num_output_tokens` (per response: the tokens it adds) add output
tensors. Part of the tensor adapter; a model is such a folder when config.pbtxt says `backend: "vllm"`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..core.errors import InvalidInput
from ..core.tensors import InferRequest, InferTensor
from .contract import TextChunk

BACKEND = "vllm"
VLLM_FLAGS = ("stream", "exclude_input_in_output", "return_finish_reason", "return_cumulative_logprob",
              "return_logprobs", "return_num_input_tokens", "return_num_output_tokens")


def is_vllm_model(config) -> bool:
    return config.backend == BACKEND


@dataclass
class VllmFlags:
    """One request's flags, and what its responses so far reported."""

    values: dict[str, bool] = field(default_factory=dict)
    cumulative_logprob: dict[int, float] = field(default_factory=dict)  # per completion index

    @classmethod
    def read(cls, request: InferRequest) -> VllmFlags:
        values = {}
        for tensor in request.inputs:
            if tensor.name in VLLM_FLAGS:
                data = tensor.data.reshape(-1)
                if data.size != 1:
                    raise InvalidInput(f"{tensor.name}: must hold one boolean", param=tensor.name)
                values[tensor.name] = bool(data[0])
        if values.get("return_logprobs"):
            raise InvalidInput("return_logprobs: not supported (ask for logprobs in sampling_parameters)",
                               param="return_logprobs")
        if values.get("stream") and values.get("exclude_input_in_output") is False:
            raise InvalidInput("exclude_input_in_output: false is not allowed when streaming",
                               param="exclude_input_in_output")
        return cls(values)

    @property
    def stream(self) -> bool:
        return self.values.get("stream", False)

    @property
    def prepend_input(self) -> bool:
        return not self.stream and not self.values.get("exclude_input_in_output", False)

    def outputs(self, chunk: TextChunk) -> list[InferTensor]:
        """The output tensors the flags ask for, for one response (`chunk`: what it adds)."""
        out = []
        if self.values.get("return_finish_reason"):
            out.append(InferTensor.from_numpy("finish_reason", np.array([str(chunk.finish_reason).encode()],
                                                                        dtype=np.object_)))
        if self.values.get("return_cumulative_logprob"):
            total = self.cumulative_logprob.get(chunk.index, 0.0)
            total += sum(e.logprob for e in chunk.logprobs or () if e.logprob is not None and math.isfinite(e.logprob))
            self.cumulative_logprob[chunk.index] = total
            out.append(InferTensor.from_numpy("cumulative_logprob", np.array([total], dtype=np.float32)))
        if self.values.get("return_num_input_tokens"):
            out.append(InferTensor.from_numpy("num_input_tokens", np.array([chunk.num_prompt_tokens], dtype=np.uint32)))
        if self.values.get("return_num_output_tokens"):
            out.append(InferTensor.from_numpy("num_output_tokens", np.array([len(chunk.token_ids)], dtype=np.uint32)))
        return out
