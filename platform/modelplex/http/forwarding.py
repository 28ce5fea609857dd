"""Triton's `--http-header-forward-pattern`: request headers whose name matches the pattern reach the
model as string request parameters (infer and generate), e.g. a tenant id a Python model reads."""
from __future__ import annotations

import re

from ..core.errors import InvalidInput

# Parameters the server itself reads from a request: a header must not set them (Triton's list).
RESERVED = frozenset({"sequence_id", "sequence_start", "sequence_end", "priority", "timeout", "headers",
                      "binary_data_output"})


class HeaderForwarding:
    """Matches header names (lower case, as HTTP/1.1 makes them case-insensitive) against the pattern
    anywhere in the name, as Triton's RE2 partial match does."""

    def __init__(self, pattern: str):
        self.regex = re.compile(pattern, re.IGNORECASE)

    @classmethod
    def of(cls, pattern: str) -> HeaderForwarding | None:
        return cls(pattern) if pattern else None

    def parameters(self, headers) -> dict[str, str]:
        """`headers` as ASGI gives them (pairs of bytes) -> the parameters to add."""
        found = {}
        for raw_name, raw_value in headers:
            name = raw_name.decode("latin-1").lower()
            if self.regex.search(name):
                if name in RESERVED or name.startswith("triton_"):
                    raise InvalidInput(f"Header '{name}' is reserved for Triton usage and cannot be forwarded.")
                found[name] = raw_value.decode("latin-1")
        return found
