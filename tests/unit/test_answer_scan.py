"""Storage reads a plain Chat or Anthropic text answer without the accumulators
(``memory.answer_scan``); what it stores must be exactly what the full parse
stores, and any other stream must go to the full parse."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from lore_gateway.collector import TurnCollector, raw_outputs
from lore_gateway.memory.store.answer_scan import plain_text
from lore_gateway.memory.store.records import RawOutputs
from lore_gateway.protocols.common import Message
from lore_gateway.routing import Protocol
from lore_gateway.testing import fake_streams as fs

# CI clones the repository with ``shared/`` beside it.
FIXTURES = Path(__file__).resolve().parents[2].parent / "shared" / "fixtures"
TRICKY = 'it said "content": "x" and\nevent: message_stop\ndata: [DONE] 🦎 \\n'


def frame(name: str, payload: object) -> bytes:
    return f"event: {name}\ndata: {orjson.dumps(payload).decode()}\n\n".encode()


def chunk(delta: object, index: object = 0) -> bytes:
    body = {"id": "c1", "object": "chat.completion.chunk", "model": "gpt-x",
            "choices": [{"index": index, "delta": delta, "finish_reason": None}]}
    return b"data: " + orjson.dumps(body) + b"\n\n"


def joined(answer: fs.Answer) -> bytes:
    return b"".join(answer.frames)


CHAT_TEXT = joined(fs.chat_text("four words of text", "gpt-x", True))
ANTHROPIC_TEXT = joined(fs.anthropic_text("four words of text", "claude-x"))
DONE = b"data: [DONE]\n\n"

# Streams storage reads itself: text, in any number of pieces.
CHAT_PLAIN = [
    CHAT_TEXT,
    joined(fs.chat_text("four words of text", "gpt-x", False)),
    joined(fs.chat_text(TRICKY, "gpt-x", True, deltas=7)),
    joined(fs.chat_text("", "gpt-x", True)),
    chunk({"role": "assistant"}) + chunk({"content": None}) + chunk({"content": "hi"}) + DONE,
    chunk({"content": "a", "tool_calls": []}) + chunk({"content": "b", "tool_calls": None}) + DONE,
    DONE,
]
ANTHROPIC_PLAIN = [
    ANTHROPIC_TEXT,
    joined(fs.anthropic_text(TRICKY, "claude-x", deltas=9)),
    joined(fs.anthropic_minimal("whole block, no deltas", "claude-x")),
    joined(fs.anthropic_blocks((("text", "first", ""), ("text", "second", "")), "claude-x")),
]
# Streams it leaves to the full parse (whatever that makes of them).
CHAT_OTHER = [
    joined(fs.chat_call("recall", '{"query": "x"}', "gpt-x", True)),
    joined(fs.chat_calls((("a", "{}"), ("b", '{"k": 1}')), "gpt-x", True)),
    CHAT_TEXT[:-len(DONE)] + b"".join(fs.chat_error_frames()) + DONE,
    CHAT_TEXT[:-len(DONE)],  # no [DONE]
    CHAT_TEXT + chunk({"content": "after the end"}),
    CHAT_TEXT.replace(b"\n", b"\r\n"),
    CHAT_TEXT.replace(b"data: ", b"data:"),
    chunk({"content": "a"}) + chunk({"refusal": "no"}) + DONE,
    chunk({"content": "a"}) + chunk({"content": "b"}, index=1) + DONE,
    chunk({"content": "a"}) + chunk({"content": "b"}, index=True) + DONE,
    chunk({"content": "a"}) + b"data: {not json\n\n" + DONE,
    chunk({"content": "a"}) + b"data: [1]\n\n" + DONE,
    b": keep-alive\n\n" + CHAT_TEXT,
    # Read in one decode, these must still not pass for plain text.
    chunk({"content": "a"})[:-2] + b"," + chunk({"content": "b"})[6:] + DONE,
    chunk({"content": "a"})[:-3] + b"\n}\n\n" + DONE,
    chunk({"content": "a"}) + b"id: 7\n" + chunk({"content": "b"}) + DONE,
    chunk({"content": "a"}).replace(b'"choices"', b'"error":null,"choices"') + DONE,
    chunk({"content": "a"}).replace(b'"choices":[', b'"choices":[{"index":0,"delta":{}},')
    + DONE,
    chunk({"content": "a"}) + b"\n" + DONE,
    # A chunk cut off inside a string and another holding its rest and a whole
    # chunk: as many JSON values as frames once joined, but not one a frame.
    chunk({"content": "a"}).replace(b'"c1"', b'"c\n\ndata: 1"') + b"data: "
    + chunk({"content": "b"})[6:-2] + b"," + chunk({"content": "c"})[6:] + DONE,
    b'{"id": "c1", "choices": []}',
]
ANOTHER_DELTA = b'{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"x"}}'
ANTHROPIC_OTHER = [
    joined(fs.anthropic_call("recall", '{"query": "x"}', "claude-x")),
    joined(fs.anthropic_blocks((("thinking", "hmm", ""), ("text", "answer", "")), "claude-x")),
    ANTHROPIC_TEXT + ANTHROPIC_TEXT,  # the gateway's own recall stream: several messages
    ANTHROPIC_TEXT + b"".join(fs.anthropic_error_frames()),
    ANTHROPIC_TEXT.replace(b"event: message_stop", b"event: message_end"),
    ANTHROPIC_TEXT.rsplit(b"event: message_stop", 1)[0],  # cut off
    ANTHROPIC_TEXT.replace(b'"index":0', b'"index":true'),
    ANTHROPIC_TEXT.replace(b"event: ping", b"event: pong"),
    ANTHROPIC_TEXT.replace(b"\n", b"\r\n"),
    ANTHROPIC_TEXT.replace(b'"text_delta"', b'"citations_delta"'),
    frame("content_block_start", {"type": "content_block_start", "index": 0,
                                  "content_block": {"type": "text", "text": "x"}})
    + ANTHROPIC_TEXT,
    # Read in one decode, these must still not pass for plain text.
    ANTHROPIC_TEXT.replace(b'"index":0,"delta"', b'"index":1,"delta"', 1),
    ANTHROPIC_TEXT.replace(b'"text_delta","text":"', b'"text_delta","text":\n"', 1),
    ANTHROPIC_TEXT.replace(b'"four "}}', b'"four "}},' + ANOTHER_DELTA, 1),
    ANTHROPIC_TEXT.replace(b'"words "}}\n', b'"words "}}\nid: 1\n', 1),
    ANTHROPIC_TEXT.replace(b'"four "}}', b'"fo\n\nevent: content_block_delta\ndata: ur "}},'
                           + ANOTHER_DELTA, 1),
]


def full_parse(protocol: Protocol, body: bytes) -> list[Message]:
    collector = TurnCollector(protocol, max_json_bytes=len(body) + 1)
    collector.feed(body)
    return collector.outputs()


@pytest.mark.parametrize("body", CHAT_PLAIN)
def test_a_plain_chat_answer_is_stored_as_the_full_parse_stores_it(body: bytes) -> None:
    assert plain_text("chat", body) == full_parse(Protocol.CHAT, body)


@pytest.mark.parametrize("body", ANTHROPIC_PLAIN)
def test_a_plain_anthropic_answer_is_stored_as_the_full_parse_stores_it(body: bytes) -> None:
    assert plain_text("anthropic", body) == full_parse(Protocol.ANTHROPIC, body)


@pytest.mark.parametrize("body", CHAT_OTHER)
def test_any_other_chat_stream_goes_to_the_full_parse(body: bytes) -> None:
    assert plain_text("chat", body) is None
    assert raw_outputs(RawOutputs("chat", body)) == full_parse(Protocol.CHAT, body)


@pytest.mark.parametrize("body", ANTHROPIC_OTHER)
def test_any_other_anthropic_stream_goes_to_the_full_parse(body: bytes) -> None:
    assert plain_text("anthropic", body) is None
    assert raw_outputs(RawOutputs("anthropic", body)) == full_parse(Protocol.ANTHROPIC, body)


def test_the_plain_fixtures_hold_text() -> None:
    assert [m.text for m in plain_text("chat", CHAT_PLAIN[2]) or []] == [TRICKY]
    assert [m.text for m in plain_text("anthropic", ANTHROPIC_PLAIN[3]) or []] == [
        "first", "second"]
    assert plain_text("chat", CHAT_PLAIN[3]) == []


RECORDED = sorted([*FIXTURES.glob("chat-completions/*.sse"), *FIXTURES.glob("anthropic/*.sse")])


@pytest.mark.parametrize("path", RECORDED, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_a_recorded_provider_stream_is_stored_as_the_full_parse_stores_it(path: Path) -> None:
    """Real providers' streams (``shared/fixtures``; a file may lack the last
    frame's blank line, which a live stream has): whichever way storage reads
    them, it stores what the full parse does, and their plain text answers are
    read without the full parse."""
    family, protocol = (("chat", Protocol.CHAT) if path.parent.name == "chat-completions"
                        else ("anthropic", Protocol.ANTHROPIC))
    body = path.read_bytes().rstrip(b"\n") + b"\n\n"
    assert raw_outputs(RawOutputs(family, body)) == full_parse(protocol, body)
    fast = plain_text(family, body)
    if path.name.startswith(("text_stream", "sdk__basic")):
        assert fast is not None and fast == full_parse(protocol, body)
