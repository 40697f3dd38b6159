"""The fake upstream's metered mode: it counts the bytes of each request as tokens
against a context window, as a provider would, so context management can be
tested without gigabytes.

Tokens are bytes / ``BYTES_PER_TOKEN``; the prefix a request shares with the
previous one counts as cache reads. An answer's usage is replaced by these
figures, and a request past the window gets the provider's own overflow error.
"""

from __future__ import annotations

from typing import Any

import orjson

from lore_gateway.testing.fake_streams import Answer

BYTES_PER_TOKEN = 4


def overflow_body(shape: str, tokens: int, window: int) -> bytes:
    """The provider's context-length error, as each one words it."""
    if shape == "anthropic":
        return orjson.dumps({"type": "error", "error": {
            "type": "invalid_request_error",
            "message": f"prompt is too long: {tokens} tokens > {window} maximum"}})
    return orjson.dumps({"error": {
        "message": f"This model's maximum context length is {window} tokens. However, your"
                   f" messages resulted in {tokens} tokens.",
        "type": "invalid_request_error", "param": "input", "code": "context_length_exceeded"}})


def common_prefix(a: bytes, b: bytes) -> int:
    """Length of the common prefix of two bodies (binary search on memcmp)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _metered_usage(shape: str, usage: dict[str, Any], tokens: int,
                   cached: int) -> dict[str, Any]:
    out = dict(usage)
    if shape == "anthropic":
        if "input_tokens" in out:
            out.update(input_tokens=tokens - cached, cache_read_input_tokens=cached,
                       cache_creation_input_tokens=0)
        return out
    if shape == "chat":
        out.update(prompt_tokens=tokens, prompt_tokens_details={"cached_tokens": cached},
                   total_tokens=tokens + int(out.get("completion_tokens") or 0))
        return out
    out.update(input_tokens=tokens, input_tokens_details={"cached_tokens": cached,
                                                          "cache_write_tokens": 0},
               total_tokens=tokens + int(out.get("output_tokens") or 0))
    return out


def metered(answer: Answer, shape: str, tokens: int, cached: int) -> Answer:
    """``answer`` with its usage replaced by the metered figures."""

    def patch(doc: Any) -> Any:
        if isinstance(doc, dict):
            return {k: (_metered_usage(shape, v, tokens, cached)
                        if k == "usage" and isinstance(v, dict) else patch(v))
                    for k, v in doc.items()}
        return doc

    frames: list[bytes] = []
    for frame in answer.frames:
        if b'"usage"' not in frame:
            frames.append(frame)
            continue
        head, _, data = frame.rstrip(b"\n").rpartition(b"data: ")
        frames.append(head + b"data: " + orjson.dumps(patch(orjson.loads(data))) + b"\n\n")
    body = orjson.dumps(patch(orjson.loads(answer.body))) if answer.body else answer.body
    return Answer(tuple(frames), body)
