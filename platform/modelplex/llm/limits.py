"""What one generate request may ask for, checked by the data plane before any work (no tokenizing,
no queueing): a prompt neither empty nor over its bytes, completions (`n`, `best_of`),
log-probabilities and stop strings. Each refusal is InvalidInput naming the field, as every door
reports it (400)."""
from __future__ import annotations

from dataclasses import dataclass

from ..core.errors import InvalidInput
from .tensor_protocol import GenerateInputs

MAX_N = 16  # completions per request, as /v1 caps them: each holds its own KV blocks and queue place
MAX_LOGPROBS = 20  # vLLM's max_logprobs
MAX_STOP_STRINGS = 64
MAX_STOP_STRING_BYTES = 1024


@dataclass(frozen=True)
class GenerateLimits:
    max_prompt_bytes: int = 4 << 20  # --max-prompt-bytes: the raw text (or the chat's contents)
    max_n: int = MAX_N
    max_logprobs: int = MAX_LOGPROBS
    max_stop_strings: int = MAX_STOP_STRINGS
    max_stop_string_bytes: int = MAX_STOP_STRING_BYTES

    def check(self, inputs: GenerateInputs) -> None:
        self._check_prompt(inputs)
        sampling = inputs.sampling
        for name in ("n", "best_of"):
            self._check_int(sampling, name, 1, self.max_n)
        if sampling.get("best_of") not in (None, sampling.get("n", 1)):
            raise InvalidInput("best_of: best_of other than n is not supported", param="best_of")
        for name in ("logprobs", "prompt_logprobs"):
            self._check_int(sampling, name, 0, self.max_logprobs)
        stop = sampling.get("stop")
        if stop is not None:
            self._check_stop([stop] if isinstance(stop, str) else stop)

    def _check_prompt(self, inputs: GenerateInputs) -> None:
        if inputs.text is not None:
            size, field = len(inputs.text.encode()), "text_input"
        elif inputs.chat is not None:
            size, field = sum(len(m["content"].encode()) for m in inputs.chat.messages), "messages"
        else:
            return  # token ids: the backend checks them against the context length
        if size == 0 and inputs.chat is None:
            raise InvalidInput(f"{field}: the prompt is empty", param=field)
        if size > self.max_prompt_bytes:
            raise InvalidInput(f"{field}: the prompt is {size} bytes; the server's limit is {self.max_prompt_bytes} "
                               "(--max-prompt-bytes)", param=field)

    @staticmethod
    def _check_int(sampling: dict, name: str, low: int, high: int) -> None:
        value = sampling.get(name)
        if value is None:
            return
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise InvalidInput(f"{name}: must be an integer in [{low}, {high}], got {value!r}", param=name)

    def _check_stop(self, stop) -> None:
        if not isinstance(stop, list):
            raise InvalidInput("stop: must be a string or a list of strings", param="stop")
        if len(stop) > self.max_stop_strings:
            raise InvalidInput(f"stop: {len(stop)} strings; at most {self.max_stop_strings}", param="stop")
        for value in stop:
            if not isinstance(value, str):
                raise InvalidInput("stop: must be a string or a list of strings", param="stop")
            if len(value.encode()) > self.max_stop_string_bytes:
                raise InvalidInput(f"stop: a stop string is longer than {self.max_stop_string_bytes} bytes",
                                   param="stop")
