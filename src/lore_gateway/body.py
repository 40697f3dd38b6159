"""Reading and decoding client request bodies, with limits.

Codex sends zstd-compressed bodies (``Content-Encoding: zstd``); other clients
may gzip. Bodies are decoded before parsing and forwarded decoded. Every step is
bounded, so a hostile body (or a decompression bomb) costs at most the limit.
"""

from __future__ import annotations

import io
import zlib
from collections.abc import Awaitable, Callable
from typing import Any

import zstandard

from lore_gateway.errors import GatewayError

Receive = Callable[[], Awaitable[dict[str, Any]]]


class ClientDisconnected(Exception):
    """The client went away before its request body was complete."""


def _too_large(limit: int) -> GatewayError:
    return GatewayError(
        413,
        "request_too_large",
        f"Request body exceeds the gateway limit of {limit} bytes; "
        "raise LORE_MAX_REQUEST_BYTES if this is legitimate.",
    )


async def read_body(receive: Receive, *, limit: int, content_length: str | None) -> bytes:
    """Read the whole request body from ASGI ``receive``, refusing more than ``limit``."""
    if content_length is not None and content_length.isdigit() and int(content_length) > limit:
        raise _too_large(limit)
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnected
        chunk = message.get("body", b"")
        if chunk:
            size += len(chunk)
            if size > limit:
                raise _too_large(limit)
            chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def decode_body(body: bytes, encoding: str | None, *, limit: int) -> bytes:
    """Undo ``Content-Encoding`` (identity, zstd, gzip, deflate), bounded by ``limit``."""
    coding = (encoding or "identity").strip().lower()
    if coding in ("", "identity"):
        return body
    try:
        if coding == "zstd":
            with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(body)) as reader:
                out = reader.read(limit + 1)
        elif coding in ("gzip", "x-gzip", "deflate"):
            wbits = 47 if coding != "deflate" else 15  # 47: auto-detect gzip/zlib header
            d = zlib.decompressobj(wbits)
            out = d.decompress(body, limit + 1)
        else:
            raise GatewayError(
                415,
                "invalid_request_error",
                f"Unsupported Content-Encoding {coding!r}; send identity, gzip or zstd.",
            )
    except (zstandard.ZstdError, zlib.error) as exc:
        raise GatewayError(
            400, "invalid_request_error", f"Request body is not valid {coding}: {exc}"
        ) from None
    if len(out) > limit:
        raise _too_large(limit)
    return out
