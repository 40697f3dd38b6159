"""What the fake provider does about context size and compaction.

A real session reaches an agent's auto-compaction threshold only after sending
hundreds of kilobytes; the fake gets there by *reporting* large usage
(``FakeUpstream.reported_input_tokens``) on answers whose bodies stay small.
It also answers the two remote compaction flows of the Codex CLI the way the
OpenAI backend does, so a test can see an agent compact when no gateway stands
in between (wave2-memory §4.2):

* ``POST …/responses/compact`` returns ``{output: [items]}``: the new history;
* a streamed ``/responses`` request ending in ``{"type": "compaction_trigger"}``
  gets exactly one ``compaction`` output item.
"""

from __future__ import annotations

from typing import Any

import orjson

from lore_gateway.testing import fake_streams as fs

FAKE_SUMMARY = "Summary written by the fake upstream's compaction."
FAKE_ENCRYPTED = "fake-upstream-encrypted-compaction"
# The providers' context-overflow messages: [OpenAI, Anthropic].
TOO_LONG = ("Your input exceeds the context window of this model (context_length_exceeded).",
            "prompt is too long: 1012345 tokens > 1000000 maximum")


def is_compaction_trigger(body: Any) -> bool:
    """Whether a Responses request asks for a v2 remote compaction."""
    items = body.get("input") if isinstance(body, dict) else None
    return (isinstance(items, list) and bool(items) and isinstance(items[-1], dict)
            and items[-1].get("type") == "compaction_trigger")


def compact_body(model: str) -> bytes:
    """The answer of ``/responses/compact``: one summary message, one compaction item."""
    return orjson.dumps({
        "id": "resp_fake_compact", "object": "response.compaction", "model": model,
        "output": [
            {"type": "message", "role": "user", "content": [
                {"type": "input_text", "text": FAKE_SUMMARY}]},
            {"type": "compaction", "id": "cmp_fake", "encrypted_content": FAKE_ENCRYPTED},
        ],
        "usage": {"input_tokens": 12, "output_tokens": 5, "total_tokens": 17},
    })


def compaction_answer(model: str) -> fs.Answer:
    """A streamed answer holding exactly one ``compaction`` item."""
    item = {"type": "compaction", "id": "cmp_fake", "encrypted_content": FAKE_ENCRYPTED}
    start: dict[str, Any] = {"id": "resp_fake_cmp", "object": "response", "status": "in_progress",
             "model": model, "output": [], "usage": None}
    usage = {"input_tokens": 12, "input_tokens_details": {"cached_tokens": 0},
             "output_tokens": 5, "output_tokens_details": {"reasoning_tokens": 0},
             "total_tokens": 17}
    done = {**start, "status": "completed", "output": [item], "usage": usage}
    frames = (
        fs.named_frame("response.created", {"type": "response.created", "sequence_number": 0,
                                            "response": start}),
        fs.named_frame("response.output_item.added", {
            "type": "response.output_item.added", "sequence_number": 1, "output_index": 0,
            "item": item}),
        fs.named_frame("response.output_item.done", {
            "type": "response.output_item.done", "sequence_number": 2, "output_index": 0,
            "item": item}),
        fs.named_frame("response.completed", {"type": "response.completed", "sequence_number": 3,
                                              "response": done}),
    )
    return fs.Answer(frames, orjson.dumps(done))


def with_input_tokens(answer: fs.Answer, api: str, input_tokens: int) -> fs.Answer:
    """``answer`` reporting ``input_tokens`` prompt tokens wherever it reports usage."""
    frames = tuple(_frame_with_usage(frame, api, input_tokens) for frame in answer.frames)
    body = answer.body
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        parsed = None
    if isinstance(parsed, dict) and isinstance(parsed.get("usage"), dict):
        _patch(parsed["usage"], api, input_tokens)
        body = orjson.dumps(parsed)
    return fs.Answer(frames, body)


def _frame_with_usage(frame: bytes, api: str, input_tokens: int) -> bytes:
    if b'"usage"' not in frame:
        return frame
    head, sep, data = frame.partition(b"data: ")
    try:
        payload = orjson.loads(data)
    except orjson.JSONDecodeError:
        return frame
    for holder in (payload, payload.get("message"), payload.get("response")):
        if isinstance(holder, dict) and isinstance(holder.get("usage"), dict):
            _patch(holder["usage"], api, input_tokens,
                   delta=payload.get("type") == "message_delta")
    return head + sep + orjson.dumps(payload) + b"\n\n"


def _patch(usage: dict[str, Any], api: str, input_tokens: int, *, delta: bool = False) -> None:
    if api == "anthropic":
        if not delta:
            usage["input_tokens"] = input_tokens
        return
    if api == "chat":
        usage["prompt_tokens"] = input_tokens
        usage["total_tokens"] = input_tokens + int(usage.get("completion_tokens") or 0)
        return
    usage["input_tokens"] = input_tokens
    usage["total_tokens"] = input_tokens + int(usage.get("output_tokens") or 0)
