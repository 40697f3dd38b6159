"""Context-length errors in each provider's shape (pure).

Anthropic: 400 ``invalid_request_error`` "prompt is too long: 215000 tokens >
200000 maximum" (413 ``request_too_large`` for bodies over its byte limit).
OpenAI Responses and Chat: 400 with ``code: context_length_exceeded``
("This model's maximum context length is 128000 tokens. However, your messages
resulted in 130000 tokens", or "Your input exceeds the context window of this
model"). Gemini: 400 ``INVALID_ARGUMENT`` "The input token count (1200293)
exceeds the maximum number of tokens allowed (1048576).". The Codex backend
reports it inside a 200 event stream (``response.failed``), which cannot be
retried once relayed; it is not handled here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import orjson

_PATTERNS = ("prompt is too long", "context_length_exceeded", "maximum context length",
             "exceeds the context window", "context window", "too many tokens",
             "exceeds the maximum number of tokens allowed")
_ANTHROPIC_RATIO = re.compile(r"(\d+)\s*tokens\s*>\s*(\d+)")
_OPENAI_RATIO = re.compile(r"maximum context length is (\d+).*?resulted in (\d+)", re.S)
_GEMINI_RATIO = re.compile(r"input token count \((\d+)\) exceeds the maximum number of tokens "
                           r"allowed \((\d+)\)")
# Error bodies read to decide (they are small; the rest is relayed unread).
MAX_ERROR_PEEK_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class Overflow:
    ratio: float | None  # requested / allowed tokens, when the message says
    limit: int | None = None  # the allowed tokens, when the message says


def detect(status: int, body: bytes) -> Overflow | None:
    """The overflow this error reports, or None when it is another error."""
    if status not in (400, 413):
        return None
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    error = data.get("error") if isinstance(data, dict) else None
    if not isinstance(error, dict):
        return None
    message = str(error.get("message") or "")
    code = str(error.get("code") or "")
    kind = str(error.get("type") or "")
    text = f"{code} {message}".lower()
    if status == 413 and kind == "request_too_large":
        return Overflow(None)
    if not any(p in text for p in _PATTERNS):
        return None
    if match := _ANTHROPIC_RATIO.search(message):
        return Overflow(int(match[1]) / max(1, int(match[2])), int(match[2]))
    if match := _OPENAI_RATIO.search(message):
        return Overflow(int(match[2]) / max(1, int(match[1])), int(match[1]))
    if match := _GEMINI_RATIO.search(message):
        return Overflow(int(match[1]) / max(1, int(match[2])), int(match[2]))
    return Overflow(None)
