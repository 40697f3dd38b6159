"""Reading and decoding client request bodies, with limits.

Codex sends zstd-compressed bodies (``Content-Encoding: zstd``); other clients
may gzip. Bodies are decoded before parsing and forwarded decoded. Every step is
bounded, so a hostile body (or a decompression bomb) costs at most the limit.
Every zstd frame and gzip member is decoded; a truncated or garbled body is a
400, never a shorter body forwarded as if it were whole.
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
    if coding in ("", "identity") or not body:
        return body
    try:
        if coding == "zstd":
            out = _unzstd(body, limit)
        elif coding in ("gzip", "x-gzip", "deflate"):
            out = _inflate(body, limit, gzip=coding != "deflate")
        else:
            raise GatewayError(
                415,
                "invalid_request_error",
                f"Unsupported Content-Encoding {coding!r}; send identity, gzip or zstd.",
            )
    except (zstandard.ZstdError, zlib.error, EOFError) as exc:
        raise GatewayError(
            400, "invalid_request_error", f"Request body is not valid {coding}: {exc}"
        ) from None
    if len(out) > limit:
        raise _too_large(limit)
    return out


def _unzstd(body: bytes, limit: int) -> bytes:
    """Every frame of a zstd body (a client may write one frame per chunk)."""
    reader = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(body),
                                                          read_across_frames=True)
    # The decoder reads a truncated frame as a shorter body without complaint, so
    # the framing is checked first: it costs a walk over block headers.
    _check_zstd_framing(body)
    with reader:
        return reader.read(limit + 1)


_ZSTD_MAGIC = 0xFD2FB528
_ZSTD_SKIPPABLE = 0x184D2A50  # ...50 to ...5F


def _check_zstd_framing(body: bytes) -> None:
    """Raise ``EOFError`` unless ``body`` is whole zstd frames, end to end (RFC 8878 §3.1)."""
    view = memoryview(body)
    pos = 0
    while pos < len(view):
        if len(view) - pos < 8:
            raise EOFError("a zstd frame is truncated")
        magic = int.from_bytes(view[pos:pos + 4], "little")
        if magic & 0xFFFFFFF0 == _ZSTD_SKIPPABLE:
            pos += 8 + int.from_bytes(view[pos + 4:pos + 8], "little")
            continue
        if magic != _ZSTD_MAGIC:
            raise EOFError("data after the last zstd frame is not a zstd frame")
        header = zstandard.frame_header_size(bytes(view[pos:pos + 18]))
        checksum = 4 if view[pos + 4] & 0x04 else 0
        pos += header
        while True:
            if len(view) - pos < 3:
                raise EOFError("a zstd frame is truncated")
            block = int.from_bytes(view[pos:pos + 3], "little")
            last, kind, size = block & 1, (block >> 1) & 3, block >> 3
            pos += 3 + (1 if kind == 1 else size)
            if last:
                break
        pos += checksum
    if pos != len(view):
        raise EOFError("a zstd frame is truncated")


def _inflate(body: bytes, limit: int, *, gzip: bool) -> bytes:
    """Every member of a gzip body (``cat a.gz b.gz`` is one valid gzip stream),
    or one zlib/raw-deflate stream; a truncated stream or trailing garbage is an
    error, never a silently shorter body."""
    # 47: auto-detect a gzip or zlib header; 15: zlib; -15 raw deflate as a fallback.
    wbits = 47 if gzip else 15
    parts: list[bytes] = []
    size = 0
    rest = body
    while True:
        d = zlib.decompressobj(wbits)
        try:
            out = d.decompress(rest, limit + 1 - size)
        except zlib.error:
            if gzip or parts or wbits == -15:
                raise
            wbits = -15  # some clients send raw deflate as "deflate"
            continue
        parts.append(out)
        size += len(out)
        if size > limit:
            break
        if not d.eof:
            if d.unconsumed_tail:
                break  # the output cap was reached: _too_large follows
            raise EOFError("the compressed stream is truncated")
        rest = d.unused_data
        if not rest:
            break
        if not gzip:
            raise EOFError("unexpected data after the compressed stream")
    return b"".join(parts)
