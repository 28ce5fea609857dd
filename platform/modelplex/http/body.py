"""Request bodies under a size limit, `Content-Encoding` request bodies and `Accept-Encoding` responses."""
from __future__ import annotations

import zlib

from ..core.errors import InvalidInput

# zlib window bits: gzip framing, and zlib framing (what "deflate" means in HTTP, and what tritonclient sends).
_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}


class ClientGone(Exception):
    """The client disconnected before its request body was complete: nobody is left to answer."""


async def read_body(receive, content_length: str | None, content_encoding: str | None, limit: int) -> bytearray:
    """The whole decoded body from an ASGI `receive`, as a writable buffer (binary tensors view it
    without copying). A body over `limit` is refused before reading it when Content-Length says so,
    and as soon as a streamed or decompressed body passes the limit."""
    if content_length is not None:
        if parse_length(content_length, "Content-Length") > limit:
            raise InvalidInput(f"request body of {content_length} bytes exceeds the server's limit of {limit} bytes")
    body = bytearray()
    more = True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone()
        body += message.get("body", b"")
        if len(body) > limit:
            raise InvalidInput(f"request body exceeds the server's limit of {limit} bytes")
        more = message.get("more_body", False)
    if content_encoding is not None and content_encoding.lower() != "identity":
        body = decompress(body, content_encoding.lower(), limit)
    return body


def parse_length(value: str, header: str) -> int:
    """A byte count header: plain ASCII digits only (str.isdigit alone would pass '²')."""
    if not (value.isascii() and value.isdigit()):
        raise InvalidInput(f"invalid {header} {value!r}")
    return int(value)


def decompress(body: bytes | bytearray, encoding: str, limit: int) -> bytearray:
    wbits = _WBITS.get(encoding)
    if wbits is None:
        raise InvalidInput(f"unsupported Content-Encoding '{encoding}': use gzip, deflate or identity")
    inflater = zlib.decompressobj(wbits)
    try:
        out = inflater.decompress(body, limit + 1)
    except zlib.error as e:
        raise InvalidInput(f"request body is not valid {encoding} data: {e}") from None
    if len(out) > limit:
        raise InvalidInput(f"decompressed request body exceeds the server's limit of {limit} bytes")
    if not inflater.eof:
        raise InvalidInput(f"request body is truncated {encoding} data")
    return bytearray(out)


def response_encoding(accept_encoding: str | None) -> str | None:
    """gzip or deflate when the client accepts it (q > 0), preferring gzip; None otherwise."""
    if not accept_encoding:
        return None
    accepted = set()
    for item in accept_encoding.lower().split(","):
        coding, *params = item.split(";")
        if all(_quality(p) > 0 for p in params):
            accepted.add(coding.strip())
    for coding in ("gzip", "deflate"):
        if coding in accepted:
            return coding
    return None


def _quality(param: str) -> float:
    """The weight a `q=...` parameter gives (1 for other parameters, 0 when unreadable)."""
    key, _, value = param.partition("=")
    if key.strip() != "q":
        return 1.0
    try:
        return float(value)
    except ValueError:
        return 0.0


def compress(body: bytes, encoding: str) -> bytes:
    compressor = zlib.compressobj(wbits=_WBITS[encoding])
    return compressor.compress(body) + compressor.flush()
