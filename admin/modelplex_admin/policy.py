"""The one access policy of both transports: which API group every HTTP route and gRPC method belongs
to, and what a request of that group must carry (restricted-API header, admin token, API key).

A new route or RPC declares its group by a line in `HTTP_ROUTES` / `GRPC_METHODS`; anything not
declared counts as model control, so it stays closed behind the admin token until someone decides.
"""
from __future__ import annotations

import hmac
import re
from dataclasses import dataclass
from typing import Mapping

from modelplex.settings import SecurityConfig

# Triton's API groups (--http-restricted-api / --grpc-restricted-protocol).
API_GROUPS = ("health", "metadata", "inference", "shared-memory", "model-config", "model-repository",
              "statistics", "trace", "logging")
# Groups that change what the server serves or how it reports: the admin token guards them.
ADMIN_GROUPS = frozenset({"model-repository", "trace", "logging"})
UNDECLARED_GROUP = "model-repository"

_MODEL = r"/v2/models/[^/]+(?:/versions/[^/]+)?"
HTTP_ROUTES: list[tuple[re.Pattern, str]] = [(re.compile(pattern), group) for pattern, group in [
    (r"/v2/health/(?:live|ready)", "health"),
    (_MODEL + r"/ready", "health"),
    (_MODEL + r"/(?:infer|generate|generate_stream)", "inference"),
    (r"/v1/(?:completions|chat/completions|embeddings|responses)", "inference"),
    (_MODEL + r"/config", "model-config"),
    (r"/v2/models/stats|" + _MODEL + r"/(?:stats|engine_stats)", "statistics"),
    (r"/v2/trace/setting|" + _MODEL + r"/trace/setting", "trace"),
    (r"/v2/logging", "logging"),
    # Adapters are loaded and unloaded like models: the same group.
    (r"/v2/repository(?:/.*)?|/v2/adapters(?:/.*)?|" + _MODEL + r"/adapters(?:/.*)?", "model-repository"),
    (r"/v1/(?:load|unload)_lora_adapter", "model-repository"),
    (r"/v2/(?:system|cuda)sharedmemory.*", "shared-memory"),
    (r"/v2|/v2/devices|" + _MODEL + r"|/v1/models(?:/.+)?", "metadata"),
    # The status page: static files whose script calls the routes above (each checked on its own).
    (r"/|/ui(?:/.*)?", "metadata"),
]]

_TRITON = "inference.GRPCInferenceService"
GRPC_METHODS: dict[str, str] = {
    f"/{_TRITON}/{method}": group for group, methods in {
        "health": ["ServerLive", "ServerReady", "ModelReady"],
        "metadata": ["ServerMetadata", "ModelMetadata"],
        "inference": ["ModelInfer", "ModelStreamInfer"],
        "model-config": ["ModelConfig"],
        "statistics": ["ModelStatistics"],
        "model-repository": ["RepositoryIndex", "RepositoryModelLoad", "RepositoryModelUnload"],
        "shared-memory": [f"{kind}SharedMemory{op}" for kind in ("System", "Cuda")
                          for op in ("Status", "Register", "Unregister")],
        "trace": ["TraceSetting"],
        "logging": ["LogSettings"],
    }.items() for method in methods
} | {"/grpc.health.v1.Health/Check": "health", "/grpc.health.v1.Health/Watch": "health"}


def http_group(path: str) -> str:
    for pattern, group in HTTP_ROUTES:
        if pattern.fullmatch(path):
            return group
    return UNDECLARED_GROUP


def grpc_group(method: str) -> str:
    return GRPC_METHODS.get(method, UNDECLARED_GROUP)


def parse_restriction(text: str) -> dict[str, tuple[str, str]]:
    """Triton's `<api-groups>:<key>=<value>`, e.g. `model-repository,logging:admin-key=s3cret`."""
    groups, sep, header = text.partition(":")
    key, eq, value = header.partition("=")
    if not sep or not eq or not key.strip() or not value:
        raise ValueError(f"expected <api-groups>:<key>=<value>, got {text!r}")
    result = {}
    for group in (g.strip() for g in groups.split(",")):
        if group not in API_GROUPS:
            raise ValueError(f"unknown API group {group!r} (one of: {', '.join(API_GROUPS)})")
        result[group] = (key.strip().lower(), value)
    return result


@dataclass(frozen=True)
class Denial:
    """Why a request is refused: 401 (no credentials) or 403 (wrong ones), and the message to send."""

    status: int
    message: str


class AccessPolicy:
    """Decides per request from its group and its headers (lower-case names); never looks at the body."""

    def __init__(self, security: SecurityConfig, restricted: Mapping[str, tuple[str, str]]):
        self.restricted = dict(restricted)
        self.admin_tokens = [t.encode() for t in security.admin_tokens]
        # An admin token may do everything an API key may.
        self.api_keys = [k.encode() for k in security.api_keys] + self.admin_tokens

    @property
    def is_open(self) -> bool:
        """Nothing to check: the transports then skip the policy entirely (no per-request cost)."""
        return not (self.restricted or self.admin_tokens or len(self.api_keys) > len(self.admin_tokens))

    def check(self, group: str, headers: Mapping[str, str]) -> Denial | None:
        restriction = self.restricted.get(group)
        if restriction is not None:
            key, value = restriction
            if not _same(headers.get(key, ""), value.encode()):
                return Denial(403, f"This API is restricted, expecting header '{key}'")
        if group in ADMIN_GROUPS and self.admin_tokens:
            return _bearer(headers, self.admin_tokens, f"the {group} API needs the admin token")
        if group == "inference" and len(self.api_keys) > len(self.admin_tokens):
            return _bearer(headers, self.api_keys, "inference needs an API key")
        return None


def _bearer(headers: Mapping[str, str], accepted: list[bytes], need: str) -> Denial | None:
    scheme, _, credential = headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not credential.strip():
        return Denial(401, f"{need}: send 'authorization: Bearer <token>'")
    # Every candidate is compared (no early exit), each in constant time.
    matches = [_same(credential.strip(), token) for token in accepted]
    return None if any(matches) else Denial(403, f"{need}: the token given is not valid")


def _same(given: str, expected: bytes) -> bool:
    return hmac.compare_digest(given.encode("utf-8", "surrogateescape"), expected)
