"""Chat and Anthropic rounds taking a read's leading text deltas in one go
(``ChatRound.take``, ``AnthropicRound.take``, ``driver.relay_reads``): whatever
the stream and however it is cut into reads, the client gets the same bytes, the
round ends in the same state and a bad frame fails the same way as when every
event is decoded and fed."""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from lore_gateway.recall.anthropic.live import AnthropicRecallStream
from lore_gateway.recall.chat.live import ChatRecallStream
from lore_gateway.recall.core import driver
from lore_gateway.sse import SSEDecoder, SSEEvent
from lore_gateway.testing import fake_streams as fs
from lore_gateway.testing.fake_wire import jsonl_frames

MODEL = "gpt-fake"
FIXTURES = Path(__file__).resolve().parents[2].parent / "shared" / "fixtures"
RECALL_ARGS = orjson.dumps({"query": "deploy target"}).decode()
ANTH_BROKEN = b'event: content_block_delta\ndata: {"type":"content_block_delta",\n\n'
TEXT = "The deploy target is the blue cluster, rotated weekly — by the platform team."


class _Adapter:
    """The two calls the relays make of a stream adapter."""

    def __init__(self, live: Any) -> None:
        self.live = live

    def feed(self, event: SSEEvent) -> bytes:
        return bytes(self.live.feed(event))

    def can_take(self) -> bool:
        return bool(self.live.round.can_take())

    def take(self, data: bytes, max_frames: int) -> tuple[int, int]:
        result: tuple[int, int] = self.live.round.take(data, max_frames)
        return result


class _Reads:
    def __init__(self, reads: list[bytes]) -> None:
        self._reads = reads

    async def chunks(self) -> AsyncIterator[bytes]:
        for data in self._reads:
            yield data


class _Client:
    def __init__(self) -> None:
        self.body = b""

    async def write(self, data: bytes) -> None:
        self.body += data


async def _batches(reads: list[bytes]) -> AsyncIterator[list[SSEEvent]]:
    decoder = SSEDecoder()
    for data in reads:
        events = decoder.feed(data)
        if events:
            yield events
    tail = decoder.close()
    if tail:
        yield tail


def _state(live: Any) -> Any:
    rnd, acc = live.round, live.round.acc
    if isinstance(live, ChatRecallStream):
        return (acc.message(), rnd.recalls, acc.usage, acc.finish_reason, acc.state_bytes)
    return (acc.content(), rnd.recalls, acc.usage, acc.stop_reason, acc.state_bytes)


def _run(kind: str, reads: list[bytes], *, fast: bool) -> tuple[bytes, str | None, Any]:
    live = ChatRecallStream() if kind == "chat" else AnthropicRecallStream()
    client = _Client()
    adapter: Any = _Adapter(live)
    relay = (driver.relay_reads(adapter, _Reads(reads), client) if fast  # type: ignore[arg-type]
             else driver.relay(adapter, _batches(reads), client))
    try:
        asyncio.run(relay)
        error = None
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
    return client.body, error, _state(live)


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    edges = [0, *sorted(set(c for c in cuts if 0 < c < len(data))), len(data)]
    return [data[a:b] for a, b in itertools.pairwise(edges)]


def _bent(frames: list[bytes], at: int, frame: bytes) -> list[bytes]:
    return [*frames[:at], frame, *frames[at:]]


def _merged(frames: list[bytes], at: int, cut: bytes) -> list[bytes]:
    """Frames ``at`` and ``at + 1`` rewritten as two frames whose payloads are
    not one JSON value each, though joined with a comma they are two: the
    first cut off inside a string (after ``cut``), the second its rest and the
    next frame's whole value. The count of values matches the count of frames."""
    start = frames[at].index(b"data: ") + 6
    prefix, one, two = frames[at][:start], frames[at][start:-2], frames[at + 1][start:-2]
    head, _, tail = one.partition(cut)
    return [*frames[:at], prefix + head + cut + b"\n\n",
            prefix + tail + b"," + two + b"\n\n", *frames[at + 2:]]


def _many_deltas(frames: list[bytes], pieces: int = 8) -> list[bytes]:
    """Each ``content_block_delta`` frame cut into ``pieces`` frames of the same
    kind, as a long thought or a tool's long JSON streams."""
    out: list[bytes] = []
    for frame in frames:
        if not frame.startswith(b"event: content_block_delta\n"):
            out.append(frame)
            continue
        event = orjson.loads(frame.split(b"data: ", 1)[1])
        delta = event["delta"]
        key = next(k for k in ("text", "thinking", "signature", "partial_json") if k in delta)
        value, step = delta[key], max(1, len(delta[key]) // pieces)
        for at in range(0, len(value), step):
            piece = {**event, "delta": {**delta, key: value[at:at + step]}}
            out.append(b"event: content_block_delta\ndata: " + orjson.dumps(piece) + b"\n\n")
    return out


def _many_arguments(frames: list[bytes], pieces: int = 8) -> list[bytes]:
    """Each Chat chunk that carries a call's arguments cut into ``pieces``
    chunks, as a tool's long arguments stream; a call's start keeps none."""
    out: list[bytes] = []
    for frame in frames:
        chunk = orjson.loads(frame[6:]) if frame.startswith(b"data: {") else None
        calls = ((chunk or {}).get("choices") or [{}])[0].get("delta", {}).get("tool_calls")
        if not calls or "id" in calls[0] or not calls[0]["function"].get("arguments"):
            out.append(frame)
            continue
        value = calls[0]["function"]["arguments"]
        step = max(1, len(value) // pieces)
        for at in range(0, len(value), step):
            call = {**calls[0], "function": {"arguments": value[at:at + step]}}
            delta = {**chunk["choices"][0]["delta"], "tool_calls": [call]}
            piece = {**chunk, "choices": [{**chunk["choices"][0], "delta": delta}]}
            out.append(b"data: " + orjson.dumps(piece) + b"\n\n")
    return out


def _sse_file(path: Path) -> list[bytes]:
    data = path.read_bytes()
    if path.name.endswith(".chunks.jsonl"):
        return list(jsonl_frames(data))
    return [f + b"\n\n" for f in data.replace(b"\r\n", b"\n").split(b"\n\n") if f.strip()]


def _streams() -> dict[str, tuple[str, list[bytes]]]:
    chat = list(fs.chat_text(TEXT, MODEL, False, deltas=12).frames)
    null_usages = list(fs.chat_text(TEXT, MODEL, True, deltas=12).frames)
    anth = list(fs.anthropic_text(TEXT, MODEL, deltas=12).frames)
    thought = "Weighing the deploy target: the blue cluster rotates weekly, so check first. " * 3
    arguments = orjson.dumps({"path": "deploy/targets.yaml", "why": thought[:120]}).decode()
    thinking = _many_deltas(list(fs.anthropic_blocks(
        (("thinking", thought, ""), ("text", TEXT, ""), ("tool_use", "read_file", arguments)),
        MODEL).frames))
    json_at = next(i for i, f in enumerate(thinking) if b'"input_json_delta"' in f) + 2
    thought_at = next(i for i, f in enumerate(thinking) if b'"thinking_delta"' in f) + 2
    call_args = orjson.dumps({"path": "deploy/targets.yaml", "content": TEXT * 4}).decode()
    call = _many_arguments(list(fs.chat_call("write_file", call_args, MODEL, True).frames))
    args_at = next(i for i, f in enumerate(call) if b'"arguments":"{' in f) + 2
    chat_delta = chat[4]
    anth_delta = next(f for f in anth[4:] if f.startswith(b"event: content_block_delta"))

    def chat_with(old: bytes, new: bytes) -> list[bytes]:
        """The Chat text stream with one content chunk, edited, inserted."""
        return _bent(chat, 5, chat_delta.replace(old, new))

    streams: dict[str, tuple[str, list[bytes]]] = {
        "chat-text": ("chat", chat),
        "chat-no-usage": ("chat", list(fs.chat_text(TEXT, MODEL, False, deltas=5).frames)),
        "chat-null-usages": ("chat", null_usages),
        "chat-recall": ("chat", list(fs.chat_call("recall", RECALL_ARGS, MODEL, True).frames)),
        "chat-tools": ("chat", list(fs.chat_calls((("read_file", "{}"), ("recall", RECALL_ARGS)),
                                                  MODEL, True).frames)),
        "chat-malformed": ("chat", _bent(chat, 5, b'data: {"choices":[{"delta":\n\n')),
        "chat-error": ("chat", _bent(chat, 5, b'data: {"error":{"message":"boom"}}\n\n')),
        "chat-two-choices": ("chat", chat_with(
            b'"choices":[', b'"choices":[{"index":1,"delta":{"content":"x"}},')),
        "chat-null-content": ("chat", chat_with(b'"content":', b'"content":null,"x":')),
        "chat-comment": ("chat", _bent(chat, 5, b": keepalive\n\n")),
        "chat-early-done": ("chat", _bent(chat, 5, b"data: [DONE]\n\n")),
        "chat-crlf": ("chat", [f.replace(b"\n", b"\r\n") for f in chat]),
        # Frames a run decoded as one JSON array must not let through.
        "chat-tool-arguments": ("chat", call),
        "chat-recall-arguments": ("chat", _many_arguments(
            list(fs.chat_call("recall", call_args, MODEL, True).frames))),
        "chat-arguments-and-text": ("chat", _bent(call, args_at, call[args_at].replace(
            b'"tool_calls"', b'"content":"x","tool_calls"'))),
        "chat-arguments-other-call": ("chat", _bent(call, args_at, call[args_at].replace(
            b'"index":0,"function"', b'"index":1,"function"'))),
        "chat-arguments-not-a-string": ("chat", _bent(call, args_at, call[args_at].split(
            b'"arguments":')[0] + b'"arguments":7}}]},"logprobs":null,"finish_reason":null}],'
            b'"usage":null}\n\n')),
        "chat-two-values": ("chat", _bent(chat, 5, chat_delta[:-2] + b"," + chat_delta[6:])),
        "chat-two-lines": ("chat", chat_with(b'"choices":', b'"choices":\n')),
        "chat-null-usage": ("chat", chat_with(b'"choices":', b'"usage":null,"choices":')),
        "chat-null-error": ("chat", chat_with(b'"choices":', b'"error":null,"choices":')),
        "chat-null-calls": ("chat", chat_with(b'"content":', b'"tool_calls":null,"content":')),
        "chat-index-one": ("chat", chat_with(b'"index":0', b'"index":1')),
        "chat-false-index": ("chat", chat_with(b'"index":0', b'"index":false')),
        "chat-merged-frames": ("chat", _merged(chat, 5, b'"chat.')),
        "chat-two-spaces": ("chat", _bent(chat, 5, b"data:  " + chat_delta[6:])),
        "chat-extra-blank": ("chat", _bent(chat, 5, b"\n")),
        "chat-field": ("chat", _bent(chat, 5, b"id: 7\n" + chat_delta)),
        "anth-text": ("anthropic", anth),
        "anth-recall": ("anthropic", list(fs.anthropic_call("recall", RECALL_ARGS, MODEL).frames)),
        "anth-blocks": ("anthropic", list(fs.anthropic_blocks(
            (("thinking", "a thought", ""), ("text", "words here", ""),
             ("tool_use", "recall", RECALL_ARGS)), MODEL).frames)),
        "anth-malformed": ("anthropic", _bent(anth, 6, ANTH_BROKEN)),
        "anth-mistyped": ("anthropic", _bent(anth, 6, anth_delta.replace(
            b'"type":"content_block_delta"', b'"type":"content_block_stop"'))),
        "anth-unopened": ("anthropic", _bent(anth, 6, anth_delta.replace(b'"index":0',
                                                                          b'"index":7'))),
        "anth-bool-index": ("anthropic", _bent(anth, 6, anth_delta.replace(b'"index":0',
                                                                            b'"index":false'))),
        "anth-ping": ("anthropic", _bent(anth, 6, b'event: ping\ndata: {"type":"ping"}\n\n')),
        "anth-no-stop": ("anthropic", anth[:-1]),
        "anth-two-values": ("anthropic", _bent(anth, 6, anth_delta[:-2] + b"," + anth_delta[33:])),
        "anth-two-lines": ("anthropic", _bent(anth, 6, anth_delta.replace(b'"delta":',
                                                                          b'"delta":\n'))),
        "anth-ping-renamed": ("anthropic", _bent(anth, 6, b"event: ping\ndata: {}\n"
                                                          b"event: content_block_stop\n\n")),
        "anth-other-delta": ("anthropic", _bent(anth, 6, anth_delta.replace(
            b'"type":"text_delta"', b'"type":"citations_delta"'))),
        "anth-merged-frames": ("anthropic", _merged(anth, 4, b'"text":"')),
        "anth-thinking-text-tool": ("anthropic", thinking),
        "anth-thinking-not-a-string": ("anthropic", _bent(thinking, thought_at, thinking[
            thought_at].split(b'"thinking":')[0] + b'"thinking":7}}\n\n')),
        "anth-json-other-index": ("anthropic", _bent(thinking, json_at, thinking[json_at].replace(
            b'"index":2', b'"index":1'))),
        "anth-json-citation": ("anthropic", _bent(thinking, json_at, thinking[json_at].replace(
            b'"input_json_delta"', b'"citations_delta"'))),
        "anth-pings": ("anthropic", _bent(_bent(anth, 3, anth[2]), 3,
                                          b"event: ping\ndata: x\r\n\n")),
    }
    assert b'"content":"' in chat_delta and b'"index":0' in anth_delta
    assert anth_delta.startswith(b"event: content_block_delta\ndata: ") and anth[2].startswith(
        b"event: ping\n")
    for path in sorted((FIXTURES / "chat-completions").glob("*.sse")):
        streams[f"recorded-{path.name}"] = ("chat", _sse_file(path))
    for path in sorted((FIXTURES / "anthropic").glob("*")):
        if path.name.endswith((".sse", ".chunks.jsonl")):
            streams[f"recorded-{path.name}"] = ("anthropic", _sse_file(path))
    return streams


STREAMS = _streams()


@pytest.mark.parametrize("name", sorted(STREAMS))
def test_taking_deltas_in_one_go_changes_nothing(name: str) -> None:
    kind, frames = STREAMS[name]
    data = b"".join(frames)
    ends = list(itertools.accumulate(map(len, frames)))
    rng = random.Random(len(name))
    cuttings = {"whole": [data], "per-frame": _split(data, ends),
                "halves": _split(data, [ends[len(ends) // 2]])}
    for n in range(4):
        cuttings[f"random-{n}"] = _split(data, [rng.randrange(1, len(data)) for _ in range(n + 2)])
    for cut, reads in cuttings.items():
        assert _run(kind, reads, fast=True) == _run(kind, reads, fast=False), f"{name}, {cut}"


@pytest.mark.parametrize("kind", ["chat", "chat-null-usages", "anthropic"])
def test_a_text_answer_is_mostly_taken_in_one_go(kind: str) -> None:
    """The point of it: after the first read, the deltas are not decoded one by
    one; also when, asked for usage, OpenAI gives every chunk ``"usage": null``."""
    frames = STREAMS[{"chat": "chat-text", "anthropic": "anth-text"}.get(kind, kind)][1]
    live = ChatRecallStream() if kind.startswith("chat") else AnthropicRecallStream()
    decoder = SSEDecoder()
    for event in decoder.feed(b"".join(frames[:3])):
        live.feed(event)
    rest = b"".join(frames[3:-3])
    taken, count = live.round.take(rest, 1000)
    assert taken == len(rest) and count == len(frames) - 6


def test_a_tools_long_arguments_are_taken_in_one_go() -> None:
    """Chunks that carry more of a started call's arguments go out as they came
    without a decode a frame; the call ends with all of them."""
    frames = STREAMS["chat-tool-arguments"][1]
    first = next(i for i, f in enumerate(frames) if b'"arguments":"{' in f)
    last = next(i for i, f in enumerate(frames) if b'"finish_reason":"' in f)
    live = ChatRecallStream()
    decoder = SSEDecoder()
    for event in decoder.feed(b"".join(frames[:first])):
        live.feed(event)
    run = b"".join(frames[first:last])
    assert live.round.take(run, 1000) == (len(run), last - first) and last - first > 4
    ((_, call),) = live.round.acc.calls()
    arguments = call["function"]["arguments"]
    assert orjson.loads(arguments)["path"] == "deploy/targets.yaml"


@pytest.mark.parametrize("kind", ["thinking_delta", "signature_delta", "input_json_delta"])
def test_a_thought_and_a_tools_json_are_taken_in_one_go(kind: str) -> None:
    """Runs of a thinking block's deltas and of a visible tool's JSON, not only
    of text, go out as they came without a decode a frame."""
    frames = STREAMS["anth-thinking-text-tool"][1]
    first = next(i for i, f in enumerate(frames) if kind.encode() in f)
    last = max(i for i, f in enumerate(frames) if f.startswith(
        b"event: content_block_delta") and kind.encode() in f)
    if kind == "thinking_delta":  # its signature follows it in the same run
        last = max(i for i, f in enumerate(frames) if b"signature_delta" in f)
    live = AnthropicRecallStream()
    decoder = SSEDecoder()
    for event in decoder.feed(b"".join(frames[:first])):
        live.feed(event)
    run = b"".join(frames[first:last + 1])
    assert live.round.take(run, 1000) == (len(run), last + 1 - first)


@pytest.mark.parametrize("kind", ["chat", "anthropic"])
def test_a_read_that_ends_inside_a_frame_does_not_stop_the_next_run(kind: str) -> None:
    """Network reads seldom end where a frame does: the next read finishes the
    frame through the decoder and takes the rest of its run in one go."""
    frames = STREAMS["chat-null-usages" if kind == "chat" else "anth-text"][1]
    data = b"".join(frames)
    middle = sum(map(len, frames[:6])) + 9  # nine bytes into the seventh frame
    live = ChatRecallStream() if kind == "chat" else AnthropicRecallStream()

    class Counting(_Adapter):
        fed = 0

        def feed(self, event: SSEEvent) -> bytes:
            Counting.fed += 1
            return super().feed(event)

    client = _Client()
    asyncio.run(driver.relay_reads(Counting(live), _Reads([data[:middle], data[middle:]]),  # type: ignore[arg-type]
                                   client))
    assert client.body == data
    # The frames before the run and the cut one, the terminal ones: no delta after.
    assert Counting.fed <= 4 + (3 if kind == "chat" else 4)


def test_a_frame_that_is_not_utf8_fails_the_stream_as_before() -> None:
    """The decoder refuses it as before. The client may now get some of the
    frames of the same read before it first (those fed one by one while the
    message starts, as before a frame with bad JSON), never the bad one."""
    frames = STREAMS["chat-text"][1]
    bad = frames[4].replace(b'"content":"', b'"content":"\xff')
    data = b"".join([*frames[:5], bad, *frames[5:]])
    body, error, _ = _run("chat", [data], fast=True)
    assert error == _run("chat", [data], fast=False)[1]
    assert error is not None and "UTF-8" in error
    assert body and data.startswith(body) and body.endswith(b"\n\n")
    assert len(body) <= len(b"".join(frames[:5]))


@pytest.mark.parametrize("kind", ["chat", "anthropic"])
def test_an_event_over_the_decoders_limit_fails_as_before(kind: str) -> None:
    frames = STREAMS["chat-text" if kind == "chat" else "anth-text"][1]
    field = b'"content":"' if kind == "chat" else b'"text":"'
    at = next(i for i, f in enumerate(frames) if i > 3 and field in f)
    huge = frames[at].replace(field, field + b"x" * (4 * 1024 * 1024), 1)
    data = b"".join([*frames[:at], huge, *frames[at + 1:]])
    for reads in ([data], _split(data, list(range(len(frames[0]), len(data), 1 << 20)))):
        fast, slow = _run(kind, reads, fast=True), _run(kind, reads, fast=False)
        assert fast[1] == slow[1] and fast[1] is not None and "limit" in fast[1]
        # As for a frame that is not UTF-8: frames before it may go out first.
        assert data.startswith(fast[0]) and len(fast[0]) <= sum(map(len, frames[:at]))
