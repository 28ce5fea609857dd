"""Typed errors for bad user input; each names the offending field."""


class EngineError(Exception):
    """Base class of every error the engine raises on purpose."""

    field: str | None = None  # the request field or setting it is about, when there is one


class InvalidRequestError(EngineError, ValueError):
    """A request or its sampling parameters are invalid; `field` names the culprit."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field, self.reason = field, message

    def __reduce__(self):  # pickled to cross to the server from the engine process
        return type(self), (self.field, self.reason)


class InvalidConfigError(EngineError, ValueError):
    """The engine configuration cannot work (e.g. the KV budget is too small)."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field, self.reason = field, message

    def __reduce__(self):  # pickled to cross to the server from the engine process
        return type(self), (self.field, self.reason)


class ModelLoadError(EngineError):
    """Weights, config or tokenizer could not be read or are of an unsupported kind."""


class AdapterNotFoundError(EngineError):
    """A request names a LoRA adapter the engine does not (or no longer) serve."""


class EngineDeadError(RuntimeError):
    """The engine stopped (its process died, a step failed, or it was shut down): what was in flight
    fails with this, and so does every later request."""
