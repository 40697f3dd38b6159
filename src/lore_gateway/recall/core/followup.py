"""The one way a recall follow-up is sent upstream (lore-spec C.1 "stream-flag
coupling").

Whether the follow-up asks for a stream and how its answer is read must never
diverge: a ``stream:false`` request read as SSE hangs, a ``stream:true`` request
parsed as JSON fails on the first byte, and the Codex backend rejects
``stream:false`` outright (400 "Stream must be set to true"). So
:func:`send_follow_up` takes the flag, writes it into the body itself, and picks
the consumer from the same flag. A body of the other shape is refused with a
clear error instead of being mis-parsed. The SSE check sniffs the body, because
the Codex backend sometimes omits the content-type. Where the request says the
flag is the protocol's :data:`StreamFlag`: the body's ``stream`` field
(:func:`body_stream_flag`), or Gemini's method in the URL.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from lore_gateway.sse import SSEDecoder, SSEEvent, looks_like_sse
from lore_gateway.upstream import UpstreamClient, UpstreamResponse, UpstreamUnavailable

# How much of a body without an event-stream content-type is read to decide
# whether it is SSE anyway (the reference's sniff window).
SNIFF_BYTES = 4096
SNIFF_CHUNKS = 64
SNIFF_SECONDS = 10.0
# Non-2xx follow-up bodies are kept this long: enough for a provider's
# context-length error (a few hundred bytes), which context management reads.
ERROR_BODY_BYTES = 4096
# A JSON follow-up answer larger than this is not a plausible single response.
DEFAULT_MAX_JSON_BYTES = 4 * 1024 * 1024
# "retry:" is the longest SSE field prefix looks_like_sse checks for.
_SNIFF_ENOUGH = 6

# Writes the stream flag into a request: (url, body, stream) -> (url, body).
StreamFlag = Callable[[str, dict[str, Any], bool], tuple[str, dict[str, Any]]]


def body_stream_flag(url: str, body: dict[str, Any],
                     stream: bool) -> tuple[str, dict[str, Any]]:
    """The flag as OpenAI and Anthropic take it: the body's ``stream`` field."""
    return url, {**body, "stream": stream}


Category = Literal[
    "follow_up_setup", "follow_up_transport", "follow_up_failed", "follow_up_protocol"
]


class FollowUpError(Exception):
    """The follow-up did not produce a usable answer. ``category`` is the C.7
    failure category; the message never contains payload text."""

    def __init__(self, category: Category, message: str, *, status: int | None = None,
                 body: bytes = b"") -> None:
        super().__init__(message)
        self.category = category
        self.status = status
        self.body = body  # an upstream error's body (bounded), never in the message


@dataclass(slots=True)
class StreamedFollowUp:
    """A ``stream:true`` follow-up whose body was confirmed to be SSE."""

    response: UpstreamResponse
    events: AsyncIterator[SSEEvent]

    def close(self) -> None:
        self.response.close()


@dataclass(frozen=True, slots=True)
class JSONFollowUp:
    """A ``stream:false`` follow-up answered with one JSON object."""

    payload: dict[str, Any]


async def send_follow_up(
    client: UpstreamClient,
    url: str,
    headers: list[tuple[str, str]],
    body: dict[str, Any],
    *,
    stream: bool,
    flag: StreamFlag = body_stream_flag,
    max_json_bytes: int = DEFAULT_MAX_JSON_BYTES,
) -> StreamedFollowUp | JSONFollowUp:
    """Send ``body`` with ``stream`` set to the flag (where ``flag`` writes it),
    and read the answer the way that flag implies. Raises :class:`FollowUpError`."""
    url, body = flag(url, body, stream)
    payload = orjson.dumps(body)
    try:
        response = await client.send("POST", url, headers, payload)
    except UpstreamUnavailable as exc:
        raise FollowUpError("follow_up_transport", f"recall follow-up fetch failed: {exc}") from exc
    try:
        if not 200 <= response.status < 300:
            error = await _read_error(response)
            raise FollowUpError(
                "follow_up_failed",
                f"recall follow-up upstream error: {response.status}",
                status=response.status,
                body=error,
            )
        if stream:
            return StreamedFollowUp(response, await _sse_events(response))
        return JSONFollowUp(await _json_payload(response, max_json_bytes))
    except BaseException:
        response.close()
        raise


async def _read_error(response: UpstreamResponse) -> bytes:
    try:
        async with asyncio.timeout(SNIFF_SECONDS):
            body, _ = await response.read(ERROR_BODY_BYTES)
    except Exception:  # diagnostics only; the status already decided the outcome
        return b""
    return body


def _is_event_stream(content_type: str) -> bool:
    return content_type.split(";", 1)[0].strip().lower() == "text/event-stream"


async def _sse_events(response: UpstreamResponse) -> AsyncIterator[SSEEvent]:
    """Confirm the body is SSE (by content-type or by sniffing), then return an
    iterator of decoded events that replays the sniffed prefix first."""
    chunks = response.chunks()
    prefix = bytearray()
    if not _is_event_stream(response.content_type):
        count = 0
        try:
            async with asyncio.timeout(SNIFF_SECONDS):
                while (
                    count < SNIFF_CHUNKS
                    and len(prefix) < SNIFF_BYTES
                    and len(prefix.removeprefix(b"\xef\xbb\xbf").lstrip()) < _SNIFF_ENOUGH
                ):
                    chunk = await anext(chunks, None)
                    if chunk is None:
                        break
                    prefix += chunk
                    count += 1
        except TimeoutError:
            pass
        if not looks_like_sse(bytes(prefix)):
            raise FollowUpError(
                "follow_up_protocol",
                f'recall follow-up expected SSE but got "{response.content_type}" '
                "and a non-SSE body",
            )
    return _decode(bytes(prefix), chunks)


async def _decode(prefix: bytes, chunks: AsyncIterator[bytes]) -> AsyncIterator[SSEEvent]:
    decoder = SSEDecoder()
    if prefix:
        for event in decoder.feed(prefix):
            yield event
    async for chunk in chunks:
        for event in decoder.feed(chunk):
            yield event
    for event in decoder.close():
        yield event


async def _json_payload(response: UpstreamResponse, limit: int) -> dict[str, Any]:
    if _is_event_stream(response.content_type):
        raise FollowUpError(
            "follow_up_protocol",
            "recall follow-up expected JSON but got SSE — stream flag/consumer mismatch",
        )
    body, cut = await response.read(limit)
    if looks_like_sse(body[:SNIFF_BYTES]):
        raise FollowUpError(
            "follow_up_protocol",
            "recall follow-up expected JSON but got SSE — stream flag/consumer mismatch",
        )
    if cut:
        raise FollowUpError(
            "follow_up_protocol", f"foreground response exceeded {limit} byte limit"
        )
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise FollowUpError(
            "follow_up_protocol", "recall follow-up returned malformed JSON"
        ) from None
    if not isinstance(parsed, dict):
        raise FollowUpError(
            "follow_up_protocol", "recall follow-up returned a non-object JSON body"
        )
    return parsed
