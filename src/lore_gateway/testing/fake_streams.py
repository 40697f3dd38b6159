"""Canned provider answers for the fake upstream, built once as bytes.

Each builder returns an :class:`Answer`: the SSE frames of a streamed answer
(every frame a complete ``bytes`` object ending in a blank line) and the JSON
body of the same answer when the client asked for ``stream: false``. The frames
follow what the real providers send and what the official SDKs require in
strict mode (see ``shared/reference/real-clients.md``), so a client that works
against the fake works against the provider.

Ids and timestamps are derived from the content, never from a clock or a
counter: the same request gives the same bytes whether a test sends it to the
fake directly or through the gateway, so the two results can be compared with
``==``. Builders are cached (bounded) because the benchmark's hot path must not
encode JSON per request.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import orjson

from lore_gateway.testing.fake_seals import sign_thinking

# A fixed, plausible creation time (2026-11-30) so answers are reproducible.
CREATED_AT = 1796037794
DEFAULT_TEXT = "Hi from the fake upstream!"
RECALL_TOOL = "recall"
DEFAULT_RECALL_QUERY = "project conventions"
# Builders are keyed by (text, model, ...); a test run uses a few dozen keys.
_CACHE_SIZE = 256


@dataclass(frozen=True, slots=True)
class Answer:
    """One complete answer: SSE frames and the equivalent non-stream body."""

    frames: tuple[bytes, ...]
    body: bytes


def _id(prefix: str, *parts: object) -> str:
    digest = hashlib.sha1(repr(parts).encode()).hexdigest()[:20]
    return f"{prefix}{digest}"


def _json(obj: Any) -> bytes:
    return orjson.dumps(obj)


def named_frame(name: str, payload: Any) -> bytes:
    """``event: <name>`` + one ``data:`` line + blank line."""
    return b"event: " + name.encode() + b"\ndata: " + _json(payload) + b"\n\n"


def data_frame(payload: Any) -> bytes:
    """A data-only frame, as Chat Completions streams use."""
    return b"data: " + _json(payload) + b"\n\n"


CHAT_DONE = b"data: [DONE]\n\n"


def split_deltas(text: str, count: int | None = None) -> list[str]:
    """Cut ``text`` into word-sized deltas ("Hi ", "from ", ...), or ``count`` pieces."""
    if count is None:
        words = text.split(" ")
        pieces = [w + " " for w in words[:-1]] + [words[-1]]
        return [p for p in pieces if p] or [""]
    count = max(1, min(count, len(text) or 1))
    step, extra = divmod(len(text), count)
    out, pos = [], 0
    for i in range(count):
        size = step + (1 if i < extra else 0)
        out.append(text[pos : pos + size])
        pos += size
    return out


# --------------------------------------------------------------------------- Responses


def _usage_responses(output_tokens: int) -> dict[str, Any]:
    return {
        "input_tokens": 12,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 12 + output_tokens,
    }


def _response(
    rid: str,
    model: str,
    status: str,
    output: list[dict[str, Any]],
    usage: dict[str, Any] | None,
    *,
    error: dict[str, Any] | None = None,
    incomplete: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "response",
        "created_at": CREATED_AT,
        "status": status,
        "error": error,
        "incomplete_details": incomplete,
        "instructions": None,
        "max_output_tokens": None,
        "model": model,
        "output": output,
        "parallel_tool_calls": True,
        "previous_response_id": None,
        "reasoning": {"effort": None, "summary": None},
        "store": False,
        "temperature": 1.0,
        "text": {"format": {"type": "text"}},
        "tool_choice": "auto",
        "tools": [],
        "top_p": 1.0,
        "truncation": "disabled",
        "usage": usage,
        "user": None,
        "metadata": {},
    }


class _Seq:
    """Builds Responses frames with a running ``sequence_number``."""

    def __init__(self) -> None:
        self.frames: list[bytes] = []

    def add(self, kind: str, **fields: Any) -> None:
        payload = {"type": kind, "sequence_number": len(self.frames), **fields}
        self.frames.append(named_frame(kind, payload))


def _message_item(mid: str, text: str, status: str) -> dict[str, Any]:
    content = [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
    return {
        "type": "message",
        "id": mid,
        "status": status,
        "role": "assistant",
        "content": content if status == "completed" else [],
    }


def _responses_text_frames(
    seq: _Seq, rid: str, mid: str, model: str, deltas: Sequence[str]
) -> dict[str, Any]:
    text = "".join(deltas)
    start = _response(rid, model, "in_progress", [], None)
    seq.add("response.created", response=start)
    seq.add("response.in_progress", response=start)
    added = _message_item(mid, "", "in_progress")
    seq.add("response.output_item.added", output_index=0, item=added)
    part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
    where = {"item_id": mid, "output_index": 0, "content_index": 0}
    seq.add("response.content_part.added", **where, part=part)
    for delta in deltas:
        seq.add("response.output_text.delta", **where, delta=delta, logprobs=[])
    seq.add("response.output_text.done", **where, text=text, logprobs=[])
    seq.add("response.content_part.done", **where, part={**part, "text": text})
    item = _message_item(mid, text, "completed")
    seq.add("response.output_item.done", output_index=0, item=item)
    return item


@lru_cache(maxsize=_CACHE_SIZE)
def responses_text(text: str, model: str, deltas: int | None = None) -> Answer:
    """A complete text answer: created ... output_item.done, completed."""
    rid, mid = _id("resp_", text, model), _id("msg_", text, model)
    seq = _Seq()
    item = _responses_text_frames(seq, rid, mid, model, split_deltas(text, deltas))
    usage = _usage_responses(len(text.split()))
    final = _response(rid, model, "completed", [item], usage)
    seq.add("response.completed", response=final)
    return Answer(tuple(seq.frames), _json(final))


@lru_cache(maxsize=_CACHE_SIZE)
def responses_call(name: str, arguments: str, model: str) -> Answer:
    """The model calls function ``name``; the turn completes with that call."""
    rid = _id("resp_", name, arguments, model)
    fid, call_id = _id("fc_", name, arguments), _id("call_", name, arguments)
    item = {
        "type": "function_call",
        "id": fid,
        "call_id": call_id,
        "name": name,
        "arguments": "",
        "status": "in_progress",
    }
    seq = _Seq()
    start = _response(rid, model, "in_progress", [], None)
    seq.add("response.created", response=start)
    seq.add("response.in_progress", response=start)
    seq.add("response.output_item.added", output_index=0, item=item)
    where = {"item_id": fid, "output_index": 0}
    seq.add("response.function_call_arguments.delta", **where, delta=arguments)
    seq.add("response.function_call_arguments.done", **where, arguments=arguments, name=name)
    done = {**item, "arguments": arguments, "status": "completed"}
    seq.add("response.output_item.done", output_index=0, item=done)
    final = _response(rid, model, "completed", [done], _usage_responses(5))
    seq.add("response.completed", response=final)
    return Answer(tuple(seq.frames), _json(final))


def responses_calls(calls: tuple[tuple[str, str], ...], model: str,
                    preamble: str | None = None) -> Answer:
    """The model calls each ``(name, arguments)`` in one response, in order, after
    a message saying ``preamble`` when one is given."""
    rid = _id("resp_", calls, model, preamble)
    seq = _Seq()
    start = _response(rid, model, "in_progress", [], None)
    seq.add("response.created", response=start)
    seq.add("response.in_progress", response=start)
    done_items: list[dict[str, Any]] = []
    if preamble is not None:
        mid = _id("msg_", rid, preamble)
        seq.add("response.output_item.added", output_index=0,
                item=_message_item(mid, "", "in_progress"))
        seq.add("response.output_text.delta", item_id=mid, output_index=0, content_index=0,
                delta=preamble)
        seq.add("response.output_text.done", item_id=mid, output_index=0, content_index=0,
                text=preamble)
        done_items.append(_message_item(mid, preamble, "completed"))
        seq.add("response.output_item.done", output_index=0, item=done_items[0])
    for position, (name, arguments) in enumerate(calls):
        index = position + len(done_items)
        fid, call_id = _id("fc_", index, name, arguments), _id("call_", index, name, arguments)
        item = {"type": "function_call", "id": fid, "call_id": call_id, "name": name,
                "arguments": "", "status": "in_progress"}
        seq.add("response.output_item.added", output_index=index, item=item)
        where = {"item_id": fid, "output_index": index}
        seq.add("response.function_call_arguments.delta", **where, delta=arguments)
        seq.add("response.function_call_arguments.done", **where, arguments=arguments,
                name=name)
        done = {**item, "arguments": arguments, "status": "completed"}
        seq.add("response.output_item.done", output_index=index, item=done)
        done_items.append(done)
    final = _response(rid, model, "completed", done_items, _usage_responses(5 * len(calls)))
    seq.add("response.completed", response=final)
    return Answer(tuple(seq.frames), _json(final))


def codex_rate_limits_frame(used_percent: float) -> bytes:
    """A ``codex.rate_limits`` frame as the Codex backend sends it (no sequence number)."""
    payload = {"type": "codex.rate_limits", "plan_type": "plus",
               "rate_limits": {"primary": {"used_percent": used_percent, "window_minutes": 300,
                                           "reset_at": CREATED_AT + 3600}}}
    return named_frame("codex.rate_limits", payload)


@lru_cache(maxsize=_CACHE_SIZE)
def responses_failed(model: str) -> Answer:
    """created, then ``response.failed`` with a server_error (as Codex sees it)."""
    rid = _id("resp_", "failed", model)
    seq = _Seq()
    seq.add("response.created", response=_response(rid, model, "in_progress", [], None))
    error = {"code": "server_error", "message": "fake failure"}
    final = _response(rid, model, "failed", [], None, error=error)
    seq.add("response.failed", response=final)
    return Answer(tuple(seq.frames), _json(final))


@lru_cache(maxsize=_CACHE_SIZE)
def responses_incomplete(text: str, model: str) -> Answer:
    """A partial message, then ``response.incomplete`` (max_output_tokens)."""
    rid, mid = _id("resp_", "incomplete", text, model), _id("msg_", "incomplete", text)
    seq = _Seq()
    item = _responses_text_frames(seq, rid, mid, model, split_deltas(text))
    item = {**item, "status": "incomplete"}
    final = _response(
        rid, model, "incomplete", [item], _usage_responses(len(text.split())),
        incomplete={"reason": "max_output_tokens"},
    )
    seq.add("response.incomplete", response=final)
    return Answer(tuple(seq.frames), _json(final))


@lru_cache(maxsize=_CACHE_SIZE)
def responses_minimal(text: str, model: str) -> Answer:
    """The smallest stream Codex accepts: created{id}, output_item.done, completed."""
    rid, mid = _id("resp_", "minimal", text, model), _id("msg_", "minimal", text)
    item = _message_item(mid, text, "completed")
    usage = _usage_responses(len(text.split()))
    frames = (
        named_frame("response.created", {"type": "response.created", "response": {"id": rid}}),
        named_frame("response.output_item.done",
                    {"type": "response.output_item.done", "output_index": 0, "item": item}),
        named_frame("response.completed",
                    {"type": "response.completed", "response": {"id": rid, "usage": usage}}),
    )
    return Answer(frames, _json(_response(rid, model, "completed", [item], usage)))


# --------------------------------------------------------------------------- Chat


def _chunk(cid: str, model: str, delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
    return {
        "id": cid,
        "object": "chat.completion.chunk",
        "created": CREATED_AT,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
    }


def _chat_usage(completion: int) -> dict[str, Any]:
    return {"prompt_tokens": 12, "completion_tokens": completion, "total_tokens": 12 + completion}


def _chat_answer(
    cid: str,
    model: str,
    deltas: list[dict[str, Any]],
    message: dict[str, Any],
    finish: str,
    usage_chunk: bool,
) -> Answer:
    # Asked for usage, OpenAI gives every chunk a ``usage`` of null and ends
    # with one chunk of no choices that carries it.
    null: dict[str, Any] = {"usage": None} if usage_chunk else {}
    frames = [data_frame({**_chunk(cid, model, d, None), **null}) for d in deltas]
    frames.append(data_frame({**_chunk(cid, model, {}, finish), **null}))
    usage = _chat_usage(5)
    if usage_chunk:
        chunk = _chunk(cid, model, {}, None)
        frames.append(data_frame({**chunk, "choices": [], "usage": usage}))
    frames.append(CHAT_DONE)
    body = {
        "id": cid,
        "object": "chat.completion",
        "created": CREATED_AT,
        "model": model,
        "choices": [
            {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}
        ],
        "usage": usage,
    }
    return Answer(tuple(frames), _json(body))


@lru_cache(maxsize=_CACHE_SIZE)
def chat_text(
    text: str, model: str, usage_chunk: bool, finish: str = "stop", deltas: int | None = None
) -> Answer:
    """A text answer as Chat Completions chunks, ending with ``data: [DONE]``."""
    cid = _id("chatcmpl-", text, model, finish)
    pieces = split_deltas(text, deltas)
    first = {"role": "assistant", "content": pieces[0], "refusal": None}
    chunks = [first] + [{"content": p} for p in pieces[1:]]
    message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None}
    return _chat_answer(cid, model, chunks, message, finish, usage_chunk)


@lru_cache(maxsize=_CACHE_SIZE)
def chat_call(name: str, arguments: str, model: str, usage_chunk: bool) -> Answer:
    """The model calls tool ``name`` (one tool_calls delta with the arguments)."""
    cid, call_id = _id("chatcmpl-", name, arguments, model), _id("call_", name, arguments)
    function = {"name": name, "arguments": ""}
    call = {"index": 0, "id": call_id, "type": "function", "function": function}
    chunks: list[dict[str, Any]] = [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"tool_calls": [{"index": 0, "function": {"arguments": arguments}}]},
    ]
    full_function = {**function, "arguments": arguments}
    full_call = {"id": call_id, "type": "function", "function": full_function}
    message = {"role": "assistant", "content": None, "refusal": None, "tool_calls": [full_call]}
    return _chat_answer(cid, model, chunks, message, "tool_calls", usage_chunk)


def chat_error_frames() -> tuple[bytes, ...]:
    """What a Chat stream carries when the provider fails mid-way: an error object."""
    error = {"message": "fake failure", "type": "server_error", "param": None, "code": None}
    return (data_frame({"error": error}),)


# --------------------------------------------------------------------------- Anthropic


def _message_start(msid: str, model: str) -> bytes:
    message: dict[str, Any] = {
        "id": msid,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {
            "input_tokens": 12,
            "output_tokens": 1,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        },
    }
    return named_frame("message_start", {"type": "message_start", "message": message})


def _anthropic_tail(stop_reason: str, output_tokens: int) -> list[bytes]:
    delta = {
        "type": "message_delta",
        "delta": {"stop_reason": stop_reason, "stop_sequence": None},
        "usage": {"output_tokens": output_tokens},
    }
    stop = named_frame("message_stop", {"type": "message_stop"})
    return [named_frame("message_delta", delta), stop]


def _anthropic_body(msid: str, model: str, content: list[dict[str, Any]], stop: str) -> bytes:
    return _json({
        "id": msid,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": {"input_tokens": 12, "output_tokens": 5},
    })


def _block_frames(index: int, block: dict[str, Any], deltas: list[dict[str, Any]]) -> list[bytes]:
    frames = [named_frame("content_block_start",
                          {"type": "content_block_start", "index": index, "content_block": block})]
    for delta in deltas:
        payload = {"type": "content_block_delta", "index": index, "delta": delta}
        frames.append(named_frame("content_block_delta", payload))
    frames.append(named_frame("content_block_stop", {"type": "content_block_stop", "index": index}))
    return frames


@lru_cache(maxsize=_CACHE_SIZE)
def anthropic_text(
    text: str, model: str, stop: str = "end_turn", deltas: int | None = None
) -> Answer:
    """A text answer as named Messages events, with a ``ping`` like the real API."""
    msid = _id("msg_", text, model, stop)
    pieces = [{"type": "text_delta", "text": p} for p in split_deltas(text, deltas)]
    block = _block_frames(0, {"type": "text", "text": ""}, pieces)
    ping = named_frame("ping", {"type": "ping"})
    frames = [_message_start(msid, model), block[0], ping, *block[1:]]
    frames += _anthropic_tail(stop, len(text.split()))
    body = _anthropic_body(msid, model, [{"type": "text", "text": text}], stop)
    return Answer(tuple(frames), body)


@lru_cache(maxsize=_CACHE_SIZE)
def anthropic_call(name: str, arguments: str, model: str) -> Answer:
    """A short text block, then a ``tool_use`` block for ``name``; stop_reason tool_use."""
    msid, tuid = _id("msg_", name, arguments, model), _id("toolu_", name, arguments)
    lead = "Let me check."
    frames = [_message_start(msid, model)]
    frames += _block_frames(0, {"type": "text", "text": ""}, [{"type": "text_delta", "text": lead}])
    tool = {"type": "tool_use", "id": tuid, "name": name, "input": {}}
    frames += _block_frames(1, tool, [{"type": "input_json_delta", "partial_json": arguments}])
    frames += _anthropic_tail("tool_use", 7)
    content = [{"type": "text", "text": lead}, {**tool, "input": orjson.loads(arguments)}]
    return Answer(tuple(frames), _anthropic_body(msid, model, content, "tool_use"))


@lru_cache(maxsize=_CACHE_SIZE)
def anthropic_minimal(text: str, model: str) -> Answer:
    """message_start, one whole text block, message_delta, message_stop; no deltas."""
    msid = _id("msg_", "minimal", text, model)
    frames = [_message_start(msid, model)]
    frames += _block_frames(0, {"type": "text", "text": text}, [])
    frames += _anthropic_tail("end_turn", len(text.split()))
    return Answer(tuple(frames),
                  _anthropic_body(msid, model, [{"type": "text", "text": text}], "end_turn"))


def anthropic_error_frames() -> tuple[bytes, ...]:
    """An ``event: error`` as Anthropic sends when it fails mid-stream."""
    error = {"type": "error", "error": {"type": "overloaded_error", "message": "fake failure"}}
    return (named_frame("error", error),)


# --------------------------------------------------------------------------- recall shapes


def _block_deltas(block: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """How a complete block streams: its empty start and the deltas that fill it."""
    kind = block["type"]
    if kind == "text":
        return {"type": "text", "text": ""}, [{"type": "text_delta", "text": block["text"]}]
    if kind == "thinking":
        return {"type": "thinking", "thinking": "", "signature": ""}, [
            {"type": "thinking_delta", "thinking": block["thinking"]},
            {"type": "signature_delta", "signature": block["signature"]},
        ]
    if kind == "tool_use":
        arguments = orjson.dumps(block["input"]).decode()
        return {**block, "input": {}}, [{"type": "input_json_delta", "partial_json": arguments}]
    return block, []  # redacted_thinking and the like arrive whole


def anthropic_blocks(blocks: tuple[tuple[str, str, str], ...], model: str) -> Answer:
    """A message of several blocks, each ``(type, name_or_text, arguments_json)``.

    ``("text", "words", "")``, ``("thinking", "thought", "")`` (streamed with the
    fake's signature of the thought, as extended thinking does) or
    ``("tool_use", "name", "{...}")``.
    The stop reason is ``tool_use`` when a tool is called.
    """
    msid = _id("msg_", blocks, model)
    content: list[dict[str, Any]] = []
    for kind, value, arguments in blocks:
        if kind == "tool_use":
            content.append({"type": "tool_use", "id": _id("toolu_", value, arguments),
                            "name": value, "input": orjson.loads(arguments)})
        elif kind == "thinking":
            content.append({"type": "thinking", "thinking": value,
                            "signature": sign_thinking(value)})
        else:
            content.append({"type": "text", "text": value})
    frames = [_message_start(msid, model)]
    for index, block in enumerate(content):
        start, deltas = _block_deltas(block)
        frames += _block_frames(index, start, deltas)
    stop = "tool_use" if any(b["type"] == "tool_use" for b in content) else "end_turn"
    frames += _anthropic_tail(stop, 7)
    return Answer(tuple(frames), _anthropic_body(msid, model, content, stop))


def chat_calls(calls: tuple[tuple[str, str], ...], model: str, usage_chunk: bool) -> Answer:
    """The model calls several tools ``(name, arguments_json)`` in one message."""
    cid = _id("chatcmpl-", calls, model)
    deltas: list[dict[str, Any]] = []
    full: list[dict[str, Any]] = []
    for index, (name, arguments) in enumerate(calls):
        call_id = _id("call_", name, arguments, index)
        start = {"index": index, "id": call_id, "type": "function",
                 "function": {"name": name, "arguments": ""}}
        head: dict[str, Any] = {"tool_calls": [start]}
        if index == 0:
            head = {"role": "assistant", "content": None, **head}
        deltas += [head, {"tool_calls": [{"index": index, "function": {"arguments": arguments}}]}]
        full.append({"id": call_id, "type": "function",
                     "function": {"name": name, "arguments": arguments}})
    message = {"role": "assistant", "content": None, "refusal": None, "tool_calls": full}
    return _chat_answer(cid, model, deltas, message, "tool_calls", usage_chunk)
