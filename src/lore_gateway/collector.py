"""Reading a relayed response into the turn's output messages.

A ``TurnCollector`` watches the bytes the proxy relays and accumulates them into
the protocol's complete response, so the finished turn (new user input + the
assistant's full output) can be handed to memory. A collector never raises into
the relay: if the stream cannot be understood, the client still gets every byte
and the turn is stored as incomplete.

``RawOutputs`` is the other way to hand output to memory: the bytes as the
client got them, parsed by the same collector where the turn is written (the
storage process), never on the event loop; ``stream_usage`` reads only the
usage the gateway needs in-process from them.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from types import ModuleType
from typing import Any

import msgspec
import orjson

from lore_gateway.memory.store.answer_scan import frame_counts, last_terminal
from lore_gateway.memory.store.records import RawOutputs, RawTurn, TurnRecord
from lore_gateway.obs import metrics
from lore_gateway.protocols import anthropic, chat, gemini, responses
from lore_gateway.protocols.accumulator import StreamAccumulator
from lore_gateway.protocols.anthropic_stream import TERMINAL_MARKS as ANTHROPIC_TERMINAL_MARKS
from lore_gateway.protocols.anthropic_stream import AnthropicAccumulator
from lore_gateway.protocols.chat_stream import TERMINAL_MARKS as CHAT_TERMINAL_MARKS
from lore_gateway.protocols.chat_stream import ChatAccumulator
from lore_gateway.protocols.common import Message, ProtocolError
from lore_gateway.protocols.gemini_stream import GeminiAccumulator, usage_from_gemini
from lore_gateway.protocols.responses_model import TERMINAL_MARKS as RESPONSES_TERMINAL_MARKS
from lore_gateway.protocols.responses_stream import ResponsesAccumulator
from lore_gateway.protocols.usage import (
    Usage,
    usage_from_anthropic,
    usage_from_chat,
    usage_from_responses,
)
from lore_gateway.routing import Family, Protocol, family_of
from lore_gateway.sse import SSEDecoder, looks_like_sse

log = logging.getLogger("lore.turns")


class _Model:
    """How the collector drives one protocol model: the protocol's one
    accumulator (``protocols.accumulator.StreamAccumulator``), the same the live
    recall rounds use, and how to read a turn out of it. Responses streams are
    read in the lenient ``codex`` mode: storage wants what the client got, not
    a protocol verdict."""

    def __init__(self, protocol: Protocol) -> None:
        self.module = _MODULES[family_of(protocol)]
        self.name = family_of(protocol).value
        self.accumulator = _ACCUMULATORS[family_of(protocol)]


# The protocol model of each wire-format family, and its accumulator for storage
# (``max_text_chars`` bounds the answer text kept).
_MODULES: dict[Family, ModuleType] = {
    Family.RESPONSES: responses,
    Family.CHAT: chat,
    Family.ANTHROPIC: anthropic,
    Family.GEMINI: gemini,
}
_ACCUMULATORS: dict[Family, Callable[[int | None], StreamAccumulator]] = {
    Family.RESPONSES: lambda limit: ResponsesAccumulator("codex", max_text_chars=limit),
    Family.CHAT: lambda limit: ChatAccumulator(max_text_chars=limit),
    Family.ANTHROPIC: lambda limit: AnthropicAccumulator(max_text_chars=limit),
    Family.GEMINI: lambda limit: GeminiAccumulator(max_text_chars=limit),
}
_MODELS: dict[Protocol, _Model] = {}
# The bytes that mark a stream's terminal frame; Gemini's stream has none (its
# last chunk carries a finishReason like others may).
_TERMINAL_MARKS: dict[Family, tuple[bytes, ...]] = {
    Family.RESPONSES: RESPONSES_TERMINAL_MARKS,
    Family.CHAT: CHAT_TERMINAL_MARKS,
    Family.ANTHROPIC: ANTHROPIC_TERMINAL_MARKS,
    Family.GEMINI: (),
}


def terminal_marks(protocol: Protocol, *, recall: bool) -> tuple[bytes, ...]:
    """What in the bytes sent shows the client got the stream's terminal frame
    (``ends_with_terminal``). None for an Anthropic stream the gateway watches for
    recall: its own recall stream holds three messages, each with a
    ``message_stop``, so one is not the end."""
    family = family_of(protocol)
    if recall and family is Family.ANTHROPIC:
        return ()
    return _TERMINAL_MARKS[family]


def ends_with_terminal(sent: bytes, marks: tuple[bytes, ...]) -> bool:
    """Whether the last frame in ``sent`` (the tail of what the client got) is a
    terminal one: a mark, and no frame begun after it. A mark that begins with a
    newline also counts at the very start of ``sent``."""
    for mark in marks:
        at = sent.rfind(mark)
        if at < 0 and mark[:1] == b"\n" and sent.startswith(mark[1:]):
            at = -1
        elif at < 0:
            continue
        rest = sent[at + len(mark):]
        if b"\ndata:" not in rest and b"\nevent:" not in rest:
            return True
    return False


def model_of(protocol: Protocol) -> _Model:
    model = _MODELS.get(protocol)
    if model is None:
        model = _MODELS[protocol] = _Model(protocol)
    return model


class TurnCollector:
    """Accumulates one upstream response (SSE or JSON) as it is relayed."""

    def __init__(self, protocol: Protocol, *, max_json_bytes: int,
                 max_text_chars: int | None = None) -> None:
        """``max_text_chars`` bounds the answer text kept (storage caps messages
        anyway); None keeps all of it, for a collector whose body is the reply."""
        self._model = model_of(protocol)
        self._max_json_bytes = max_json_bytes
        self._max_text = max_text_chars
        # A Responses stream repeats every delta's text in its ``*.done`` events
        # (``output_text.done``, ``output_item.done``), so storage skips the deltas:
        # most of the events, and most of the parsing cost. The price: an answer
        # cut off before its done events is stored without its partial text.
        self._skip_deltas = max_text_chars is not None and self._model.name == "responses"
        self._sse: SSEDecoder | None = None
        self._acc: StreamAccumulator | None = None
        # Earlier messages of the same stream: the gateway's own recall stream to an
        # Anthropic client holds three (preamble, marker, continuation).
        self._earlier: list[StreamAccumulator] = []
        self._json: bytearray | None = None
        self.error: Exception | None = None

    def feed(self, chunk: bytes) -> None:
        if self.error is not None:
            return
        try:
            if self._sse is None and self._json is None:
                if looks_like_sse(chunk[:64]):
                    self._sse = SSEDecoder(skip_suffix=b".delta" if self._skip_deltas else None)
                    self._acc = self._model.accumulator(self._max_text)
                else:
                    self._json = bytearray()
            if self._sse is not None:
                acc = self._acc
                assert acc is not None  # made with the decoder
                for event in self._sse.feed(chunk):
                    if self._skip_deltas and event.event and event.event.endswith(".delta"):
                        continue
                    if acc.done and event.event == "message_start":
                        self._earlier.append(acc)
                        acc = self._acc = self._model.accumulator(self._max_text)
                    acc.feed_event(event)
            else:
                assert self._json is not None
                if len(self._json) + len(chunk) > self._max_json_bytes:
                    raise ValueError("response body exceeds the storage accumulation limit")
                self._json += chunk
        except Exception as exc:
            self.error = exc
            log.debug("turn collector stopped: %s", exc)

    def _finish(self) -> None:
        if self._sse is not None and self.error is None:
            acc = self._acc
            assert acc is not None  # made with the decoder
            try:
                for event in self._sse.close():
                    acc.feed_event(event)
                acc.close()
            except Exception as exc:
                self.error = exc
            self._sse = None

    def response_body(self) -> dict[str, Any]:
        """The complete non-stream body (the Codex backend's stream answered as JSON)."""
        self._finish()
        if self.error is not None:
            raise self.error
        if self._acc is None:
            raise ValueError("the upstream sent no event stream")
        return self._acc.response_body()

    def usage(self) -> Usage | None:
        """The usage the upstream reported last (None when it sent none)."""
        usage = None
        with contextlib.suppress(Exception):
            for acc in [*self._earlier, self._acc]:
                found = acc.result().usage if acc is not None else None
                if found is not None:
                    usage = found
        return usage

    def report_usage(self, protocol: str) -> None:
        """Feed the prompt-cache metrics from the usage the upstream reported."""
        usage = self.usage()
        if usage is not None:
            metrics.record_usage(protocol, usage.prompt_tokens, usage.cache_read or 0,
                                 usage.output_tokens)

    def response_id(self) -> str | None:
        """The upstream response's id, once the stream carried it (Responses only)."""
        try:
            if self._acc is not None and self._model.name == "responses":
                rid = self._acc.result().id
                return rid if isinstance(rid, str) and rid else None
        except Exception:
            return None
        return None

    def _accumulate_body(self, body: dict[str, Any]) -> None:
        """Run a non-stream body through the same accumulator as a stream (via the
        model's stream synthesiser), so every stored turn is built one way."""
        self._acc = self._model.accumulator(self._max_text)
        decoder = SSEDecoder()
        for frame in self._model.module.stream_from_response(body):
            for event in decoder.feed(frame):
                self._acc.feed_event(event)
        self._acc.close()

    def outputs(self) -> list[Message]:
        """The assistant's output so far (complete after a successful relay)."""
        self._finish()
        try:
            if self._acc is None and self._json:
                self._accumulate_body(orjson.loads(self._json))
            if self._acc is not None:
                out: list[Message] = []
                for acc in [*self._earlier, self._acc]:
                    out.extend(self._model.module.output_messages(acc))
                return out
        except Exception as exc:
            log.debug("could not extract output messages: %s", exc)
        return []


def report_usage(protocol: str, usage: Usage | None) -> None:
    """Feed the prompt-cache metrics from the usage the upstream reported."""
    if usage is not None:
        metrics.record_usage(protocol, usage.prompt_tokens, usage.cache_read or 0,
                             usage.output_tokens)


def raw_outputs(raw: RawOutputs) -> list[Message]:
    """The output messages of bytes a client received, ``raw.recalls`` at their
    markers (``recall_order``). A plain text answer is read without the
    accumulators (``answer_scan``)."""
    from lore_gateway.memory.store.answer_scan import plain_text, responses_output
    from lore_gateway.memory.store.recall_order import place_recalls

    protocol = Protocol(raw.protocol)
    family = family_of(protocol)
    outputs = (responses_output(raw.body) if family is Family.RESPONSES
               else plain_text(family.value, raw.body))
    if outputs is None:
        # Text bounded by the body's length: never cut, and a Responses stream's
        # deltas are skipped (its done events repeat them), as on the relay.
        collector = TurnCollector(protocol, max_json_bytes=len(raw.body) + 1,
                                  max_text_chars=len(raw.body))
        collector.feed(raw.body)
        outputs = collector.outputs()
    return place_recalls(outputs, raw.recalls)


def resolve_turn(raw: RawTurn) -> TurnRecord | None:
    """The turn of a ``RawTurn``, its output parsed (None: no message at all)."""
    turn = raw.turn
    messages = (*turn.messages, *raw_outputs(raw.output))
    if not messages:
        return None
    metas = ({"side_channel": raw.side_channel},) * len(messages) if raw.side_channel else None
    return TurnRecord(identity=turn.identity, protocol=turn.protocol, model=turn.model,
                      messages=messages, created_at=turn.created_at, complete=turn.complete,
                      metas=metas)


def stream_usage(protocol: Protocol, body: bytes) -> Usage | None:
    """The usage a ``TurnCollector`` would report for this event stream, read
    from its usage events alone (the rest of the stream is not decoded): an
    Anthropic stream's message events, a Chat stream's last usage, a Responses
    stream's terminal. A stream that is not of the usual shape (CR line endings,
    an error event, a data field over several lines) is parsed whole instead."""
    try:
        family = family_of(protocol)
        if family is Family.RESPONSES:
            found = _responses_usage(body)
        elif family is Family.GEMINI:
            found = _gemini_usage(body)
        elif b"\r" not in body and b'"error"' not in body:
            found = (_anthropic_usage(body) if family is Family.ANTHROPIC
                     else _chat_usage(body))
        else:
            found = _UNSURE
        if found is not _UNSURE:
            return found  # type: ignore[return-value]
    except (ValueError, TypeError, AttributeError, msgspec.DecodeError):
        pass
    collector = TurnCollector(protocol, max_json_bytes=len(body) + 1)
    collector.feed(body)
    return collector.usage()


_UNSURE = object()


def _data_line(body: bytes, start: int) -> Any:
    """The JSON of the ``data: `` line starting at ``start``."""
    if not body.startswith(b"data: ", start):
        raise ValueError("not a data line")
    end = body.find(b"\n", start)
    return orjson.loads(body[start + 6:end if end != -1 else len(body)])


def _anthropic_usage(body: bytes) -> object:
    """Per message (each from its ``message_start``), the start's usage updated
    with every ``message_delta``'s; the last message's that has any."""
    usage: Usage | None = None
    wire: dict[str, Any] | None = None
    pos = 0
    while True:
        at = body.find(b"event: message_", pos)
        if at == -1:
            break
        line_end = body.find(b"\n", at)
        if line_end == -1 or (at and body[at - 1] != 0x0A):
            return _UNSURE
        name = body[at + 7:line_end]
        pos = line_end + 1
        if name == b"message_start":
            if wire:
                usage = usage_from_anthropic(wire)
            message = _data_line(body, pos).get("message")
            found = message.get("usage") if isinstance(message, dict) else None
            wire = dict(found) if isinstance(found, dict) else {}
        elif name == b"message_delta":
            if wire is None:
                return _UNSURE
            found = _data_line(body, pos).get("usage")
            if isinstance(found, dict):
                wire.update({k: v for k, v in found.items() if v is not None})
    if wire:
        usage = usage_from_anthropic(wire)
    return usage


def _gemini_usage(body: bytes) -> object:
    """The last record's ``usageMetadata`` (each record repeats the answer's
    usage so far; the accumulator keeps the last). A key inside a string is
    escaped, so a bare ``"usageMetadata"`` is a record's own."""
    if b'"error"' in body:
        return _UNSURE
    at = body.rfind(b'"usageMetadata"')
    if at == -1:
        return None
    start = body.rfind(b"\n", 0, at) + 1
    end = body.find(b"\n", at)
    line = body[start:end if end != -1 else len(body)].rstrip(b"\r")
    record = orjson.loads(line.removeprefix(b"data:").lstrip(b" "))
    meta = record.get("usageMetadata") if isinstance(record, dict) else None
    if not isinstance(meta, dict):
        return _UNSURE
    try:
        return usage_from_gemini(meta)
    except ProtocolError:
        return None  # the accumulator fails the stream on a malformed usage


def _chat_usage(body: bytes) -> object:
    """The last chunk's ``usage`` that is not null."""
    end = len(body)
    while True:
        at = body.rfind(b'"usage"', 0, end)
        if at == -1:
            return None
        start = body.rfind(b"\n", 0, at) + 1
        chunk = _data_line(body, start)
        if isinstance(chunk, dict) and chunk.get("usage") is not None:
            return usage_from_chat(chunk["usage"])
        end = start


class _TerminalResponse(msgspec.Struct):
    usage: dict[str, Any] | None = None


class _Terminal(msgspec.Struct):
    """What the usage needs of a Responses terminal; the output, often most of
    the frame, is checked but not built."""

    type: str
    response: _TerminalResponse


_decode_terminal = msgspec.json.Decoder(_Terminal).decode


def _responses_usage(body: bytes) -> object:
    """The usage of a Responses stream of one response: its terminal's, the
    stream's last frame (the accumulator reads it nowhere else)."""
    last = last_terminal(body)
    if last is None:
        return _UNSURE
    counts = frame_counts(body)
    if counts.errors or counts.created > 1 or counts.terminals != 1:
        return _UNSURE
    if not body.isascii():
        body.decode()  # the decoder refuses a stream that is not UTF-8 (ValueError)
    name, data, _alone = last
    terminal = _decode_terminal(data)
    if terminal.type != name:
        return _UNSURE
    if terminal.response.usage is None:
        return None
    try:
        return usage_from_responses(terminal.response.usage)
    except ProtocolError:
        return None  # the accumulator fails the stream on a malformed usage
