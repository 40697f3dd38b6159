"""A streamed Chat or Anthropic answer that went out in one round, as the
upstream sent it, reports the usage its live round read (``OneRound``) instead
of reading the client's bytes again (``collector.stream_usage``): for every
stream, the same usage, or the same error, as that second read gives."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from lore_gateway.collector import stream_usage
from lore_gateway.protocols.common import ProtocolError
from lore_gateway.recall.anthropic import handler as anthropic_handler
from lore_gateway.recall.chat import handler as chat_handler
from lore_gateway.recall.core.budget import RecallChainBudget
from lore_gateway.recall.core.chain import RecallContext
from lore_gateway.routing import Protocol
from lore_gateway.testing import fake_streams as fs
from lore_gateway.testing.fake_wire import jsonl_frames

MODEL = "gpt-fake"
TEXT = "The deploy target is the blue cluster, rotated weekly — by the platform team."
FIXTURES = Path(__file__).resolve().parents[2].parent / "shared" / "fixtures"


class _Principal:
    def __init__(self, data: bytes) -> None:
        self._data = data

    async def chunks(self) -> AsyncIterator[bytes]:
        for at in range(0, len(self._data), 700):  # several reads, cut anywhere
            yield self._data[at:at + 700]

    def close(self) -> None:
        pass


class _Client:
    def __init__(self) -> None:
        self.body = b""

    async def start(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        pass

    async def write(self, data: bytes) -> None:
        self.body += data

    async def end(self, data: bytes = b"") -> None:
        self.body += data


def _ctx() -> RecallContext:
    # No stream here calls recall: the chain never reaches the executor.
    return RecallContext(upstream=None, url="", headers=[], body={},  # type: ignore[arg-type]
                         executor=None, budget=RecallChainBudget())  # type: ignore[arg-type]


def _chat_usage_stream(*usages: bytes) -> bytes:
    """The Chat text stream with its usage chunk replaced by one chunk per
    ``usages`` (a JSON value each)."""
    frames = list(fs.chat_text(TEXT, MODEL, False, deltas=6).frames)
    extra = [b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m",'
             b'"choices":[],"usage":' + u + b"}\n\n" for u in usages]
    return b"".join([*frames[:-1], *extra, frames[-1]])


def _anth_usage_stream(start: bytes, delta: bytes) -> bytes:
    data = b"".join(fs.anthropic_text(TEXT, MODEL, deltas=6).frames)
    head, sep, rest = data.partition(b'"usage":')
    end = rest.index(b"}") + 1
    data = head + sep + start + rest[end:]
    at = data.index(b"event: message_delta")
    head, sep, rest = data[at:].partition(b'"usage":')
    end = rest.index(b"}") + 1
    return data[:at] + head + sep + delta + rest[end:]


def _streams() -> dict[str, tuple[str, bytes]]:
    streams: dict[str, tuple[str, bytes]] = {
        "chat-usage": ("chat", b"".join(fs.chat_text(TEXT, MODEL, True, deltas=6).frames)),
        "chat-no-usage": ("chat", b"".join(fs.chat_text(TEXT, MODEL, False, deltas=6).frames)),
        "chat-cached": ("chat", _chat_usage_stream(
            b'{"prompt_tokens":90,"completion_tokens":7,"total_tokens":97,'
            b'"prompt_tokens_details":{"cached_tokens":64}}')),
        "chat-two-usages": ("chat", _chat_usage_stream(
            b'{"prompt_tokens":1,"completion_tokens":1}',
            b'{"prompt_tokens":5,"completion_tokens":3}')),
        "chat-null-last": ("chat", _chat_usage_stream(
            b'{"prompt_tokens":5,"completion_tokens":3}', b"null")),
        "chat-empty-usage": ("chat", _chat_usage_stream(b"{}")),
        "chat-usage-not-an-object": ("chat", _chat_usage_stream(
            b'{"prompt_tokens":5,"completion_tokens":3}', b"5")),
        "chat-bad-count": ("chat", _chat_usage_stream(b'{"prompt_tokens":"many"}')),
        "anth-text": ("anthropic", b"".join(fs.anthropic_text(TEXT, MODEL, deltas=6).frames)),
        "anth-cache": ("anthropic", _anth_usage_stream(
            b'{"input_tokens":3,"cache_read_input_tokens":800,'
            b'"cache_creation_input_tokens":12,"output_tokens":1}',
            b'{"output_tokens":42,"cache_read_input_tokens":null}')),
        "anth-no-start-usage": ("anthropic", _anth_usage_stream(
            b"null", b'{"output_tokens":42}')),
        "anth-no-usage": ("anthropic", _anth_usage_stream(b"{}", b"{}")),
        "anth-bad-count": ("anthropic", _anth_usage_stream(
            b'{"input_tokens":-1}', b'{"output_tokens":1}')),
    }
    for path in sorted((FIXTURES / "chat-completions").glob("*.sse")):
        streams[f"recorded-{path.name}"] = ("chat", path.read_bytes())
    for path in sorted((FIXTURES / "anthropic").glob("*")):
        if path.name.endswith(".sse"):
            streams[f"recorded-{path.name}"] = ("anthropic", path.read_bytes())
        elif path.name.endswith(".chunks.jsonl"):
            streams[f"recorded-{path.name}"] = ("anthropic",
                                                b"".join(jsonl_frames(path.read_bytes())))
    return streams


STREAMS = _streams()


def _outcome(read: Any) -> Any:
    try:
        return ("usage", read())
    except ProtocolError as exc:
        return ("error", str(exc))


@pytest.mark.parametrize("name", sorted(STREAMS))
def test_one_round_usage_is_what_the_clients_bytes_say(name: str) -> None:
    kind, data = STREAMS[name]
    if b'"recall"' in data:
        pytest.skip("a recall call needs the chain's executor")
    handler = chat_handler if kind == "chat" else anthropic_handler
    protocol = Protocol.CHAT if kind == "chat" else Protocol.ANTHROPIC
    client = _Client()
    one_round: Any = None

    def live() -> Any:
        nonlocal one_round
        one_round = asyncio.run(handler.stream_recall(_ctx(), _Principal(data),  # type: ignore[arg-type]
                                                      client, []))
        return None if one_round is None else one_round.usage

    got = _outcome(live)
    if one_round is None and got[0] == "usage":
        return  # not one round as it came (an error event, say): the bytes are read
    assert got == _outcome(lambda: stream_usage(protocol, client.body)), name


def test_the_usual_streams_are_answered_from_the_round() -> None:
    """The point of it: a plain answer's usage is not read twice."""
    for name in ("chat-usage", "chat-cached", "anth-text", "anth-cache"):
        kind, data = STREAMS[name]
        handler = chat_handler if kind == "chat" else anthropic_handler
        one_round = asyncio.run(handler.stream_recall(_ctx(), _Principal(data),  # type: ignore[arg-type]
                                                      _Client(), []))
        assert one_round is not None and one_round.usage is not None, name
        assert one_round.usage.output_tokens > 0, name
