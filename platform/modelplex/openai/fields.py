"""Request fields nobody declared: vLLM accepts them and logs a warning once per field name; with
`--openai-strict-fields` they are a 400 naming the field (OpenAI's own behaviour)."""
from __future__ import annotations

import logging
import threading

from pydantic import BaseModel

from .errors import RequestError

log = logging.getLogger(__name__)


def unknown_fields(body: BaseModel, prefix: str = "") -> list[str]:
    """Dotted names of the undeclared fields of `body` and of the models nested in it."""
    names = [prefix + name for name in (body.model_extra or {})]
    for name in type(body).model_fields:
        value = getattr(body, name)
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, BaseModel):
                names += unknown_fields(item, f"{prefix}{name}.")
    return names


class FieldPolicy:
    """What one server does with undeclared fields. Thread-safe; remembers which names it warned about."""

    def __init__(self, strict: bool):
        self.strict = strict
        self._warned: set[str] = set()
        self._lock = threading.Lock()

    def check(self, body: BaseModel, route: str) -> None:
        names = unknown_fields(body)
        if not names:
            return
        if self.strict:
            raise RequestError(names[0], f"Unrecognized request argument supplied: {names[0]}")
        with self._lock:
            new = [name for name in names if (route, name) not in self._warned]
            self._warned.update((route, name) for name in new)
        for name in new:
            log.warning("%s: ignoring the unknown request field '%s' (warned once; --openai-strict-fields refuses "
                        "unknown fields)", route, name)
