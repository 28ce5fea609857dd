"""The one access policy of both transports: what a request of each API group
(`modelplex.API_GROUPS`) must carry: restricted-API header, admin token, API key."""
from __future__ import annotations

import hmac
from collections.abc import Mapping

from modelplex import ADMIN_GROUPS, API_GROUPS, Denial

from .config import SecurityConfig

# gRPC metadata Triton checks for `--grpc-restricted-protocol ...:<key>=<value>`: this prefix and the key.
GRPC_HEADER_PREFIX = "triton-grpc-protocol-"


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
        if group in result:
            raise ValueError(f"restricted api '{group}' can not be specified in multiple config groups")
        result[group] = (key.strip().lower(), value)
    return result


def parse_restrictions(texts: list[str], flag: str) -> dict[str, tuple[str, str]]:
    """Every `flag` given; a group restricted twice is refused, as Triton refuses it at startup."""
    result: dict[str, tuple[str, str]] = {}
    for text in texts:
        for group, restriction in parse_restriction(text).items():
            if group in result:
                raise ValueError(f"{flag}: restricted api '{group}' can not be specified in multiple config groups")
            result[group] = restriction
    return result


class AccessPolicy:
    """Decides per request from its group and its headers (lower-case names); never looks at the body."""

    def __init__(self, security: SecurityConfig, restricted: Mapping[str, tuple[str, str]], transport: str = "http"):
        # group -> (the headers that may carry the value, the value). gRPC: Triton's
        # `triton-grpc-protocol-<key>`, and the bare key this plugin took before.
        self.restricted = {group: ((GRPC_HEADER_PREFIX + key, key) if transport == "grpc" else (key,), value)
                           for group, (key, value) in restricted.items()}
        self._refusal = "This protocol is restricted" if transport == "grpc" else "This API is restricted"
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
            names, value = restriction
            given = next((headers[name] for name in names if name in headers), "")
            if not _same(given, value.encode()):
                return Denial(403, f"{self._refusal}, expecting header '{names[0]}'")
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
