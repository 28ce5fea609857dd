"""Which of Triton's API groups every HTTP route and gRPC method belongs to.

Access policies (`--http-restricted-api`, admin tokens) and the separate admin address decide per
group. A new route or RPC declares its group by a line in `HTTP_ROUTES` / `GRPC_METHODS`; anything
not declared counts as model control, so it stays behind the admin door until someone decides.
"""
from __future__ import annotations

import re

# Triton's API groups (--http-restricted-api / --grpc-restricted-protocol).
API_GROUPS = ("health", "metadata", "inference", "shared-memory", "model-config", "model-repository",
              "statistics", "trace", "logging")
# Groups that change what the server serves or how it reports: the admin door guards them.
ADMIN_GROUPS = frozenset({"model-repository", "trace", "logging"})
UNDECLARED_GROUP = "model-repository"

_MODEL = r"/v2/models/[^/]+(?:/versions/[^/]+)?"
HTTP_ROUTES: list[tuple[re.Pattern, str]] = [(re.compile(pattern), group) for pattern, group in [
    (_MODEL + r"/ready", "health"),
    (_MODEL + r"/(?:infer|generate|generate_stream)", "inference"),
    (r"/v2/health/(?:live|ready)|/health|/ping", "health"),
    (r"/v1/(?:completions|chat/completions|embeddings|responses)|/tokenize|/detokenize", "inference"),
    (r"/metrics", "statistics"),
    (_MODEL + r"/config", "model-config"),
    (r"/v2/models/stats|" + _MODEL + r"/(?:stats|engine_stats)", "statistics"),
    (r"/v2/trace/setting|" + _MODEL + r"/trace/setting", "trace"),
    (r"/v2/logging", "logging"),
    # Adapters are loaded and unloaded like models: the same group.
    (r"/v2/repository(?:/.*)?|/v2/adapters(?:/.*)?|" + _MODEL + r"/adapters(?:/.*)?", "model-repository"),
    (r"/v1/(?:load|unload)_lora_adapter", "model-repository"),
    (r"/v2/(?:system|cuda)sharedmemory.*", "shared-memory"),
    (r"/v2|/v2/devices|/openapi\.json|/docs|/version|" + _MODEL + r"|/v1/models(?:/.+)?", "metadata"),
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
