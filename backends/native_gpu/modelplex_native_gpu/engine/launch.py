"""start_engine: the engine a serving instance talks to, in a process of its own or in a thread of the server's."""
from __future__ import annotations

from collections.abc import Callable

from ..config import EngineConfig
from .async_engine import AsyncLLMEngine
from .core_client import EngineProcessClient


def start_engine(config: EngineConfig, on_progress: Callable[[str], None] | None = None,
                 on_failure: Callable[[str], None] | None = None, cancel=None) -> AsyncLLMEngine | EngineProcessClient:
    """Both kinds share one interface: generate, abort, num_waiting, tokenizer, max_model_len, vocab_size,
    stats, compile_constraint, the lora_* methods and close. `on_failure` hears why the engine stopped
    serving (its process died, a step raised); `cancel` (the host's LoadCancel) stops a load given up on."""
    if config.engine_process:
        return EngineProcessClient(config, on_progress, on_failure, cancel)
    from .llm_engine import LLMEngine
    from .structured_output import preload

    preload()  # here, not on a request's thread (see preload)
    return AsyncLLMEngine(LLMEngine(config, on_progress=on_progress), on_failure)
