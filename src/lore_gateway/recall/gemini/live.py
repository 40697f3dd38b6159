"""Live recall interception for a Gemini ``streamGenerateContent`` stream
(lore-spec C.2), sans-IO.

Upstream SSE records go in; the bytes the client should receive now come out.
Nothing here touches a socket, the memory or the clock: the asyncio shell
(``recall/gemini/handler.py``) reads the upstream, runs the recall and the
follow-up, and asks this machine what to write.

A Gemini stream has no envelope and no terminal frame: every record is a whole
``GenerateContentResponse`` holding the parts generated since the previous one,
and the record that carries the candidate's ``finishReason`` ends the answer.
So a recall is hidden by rewriting records, not by dropping frames:

* :class:`GeminiRound` relays one upstream answer (the principal or one
  continuation). A record without a ``recall`` function call goes out as it
  came; one with it goes out without that part (not at all when nothing else
  is left). Once a recall was seen (and always in a continuation) the record
  with the ``finishReason`` is held: the shell decides later whether the
  answer ends there. Every record is also applied to the round's
  :class:`~lore_gateway.protocols.gemini_stream.GeminiAccumulator`, hidden
  parts included, because the follow-up and the stored turn are built from it.
  Most records only add text: a run of them at the start of a read is taken
  in one go (:meth:`GeminiRound.take`, decoded in C), and goes out as it came.
* :class:`GeminiRecallStream` splices rounds into the one answer a Gemini
  client sees: the preamble's parts, a record holding the marker text, the
  continuation's parts, and one ``finishReason`` at the end, whose record
  carries the usage of every round.

Gemini's SDKs read only ``data:`` lines and stop at anything else (the JS SDK
matches each frame against ``^data: ``), so even the keepalive is a record: an
empty ``{}``, which carries no candidate and changes nothing.
"""

from __future__ import annotations

from typing import Any

import orjson

from lore_gateway.protocols.accumulator import StateLimitExceeded
from lore_gateway.protocols.common import ProtocolError
from lore_gateway.protocols.gemini_stream import GeminiAccumulator, text_records
from lore_gateway.recall.chat.live import marker_content
from lore_gateway.recall.core.chain import RecallCall
from lore_gateway.recall.core.tool import RECALL_TOOL_NAME
from lore_gateway.sse import SSEEvent

# What one round may retain (lore-spec E.1, 16 MiB, as the other live paths):
# the records' JSON as it came, a generous bound on the accumulated answer.
DEFAULT_MAX_STATE_BYTES = 16 * 1024 * 1024

# A data-only frame, ended by a CRLF blank line as the Gemini API ends its own.
KEEPALIVE = b"data: {}\r\n\r\n"

# Finish reasons that cut an answer short (C.1 "usable continuation").
_CUT_SHORT = ("MAX_TOKENS", "MALFORMED_FUNCTION_CALL")

# ``usageMetadata`` counts summed across rounds (lore-spec C.3 "usage merge"); a
# count no round reported is never added.
_SUMMED_USAGE_FIELDS = (
    "promptTokenCount",
    "candidatesTokenCount",
    "totalTokenCount",
    "thoughtsTokenCount",
    "cachedContentTokenCount",
    "toolUsePromptTokenCount",
)


def encode_record(record: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(record) + b"\r\n\r\n"


def is_recall_part(part: Any) -> bool:
    call = part.get("functionCall") if isinstance(part, dict) else None
    return isinstance(call, dict) and call.get("name") == RECALL_TOOL_NAME


def content_usable(finish_reason: Any, parts: list[dict[str, Any]]) -> bool:
    """C.1 "usable continuation": some answer text or a function call, and not
    cut short."""
    if finish_reason in _CUT_SHORT:
        return False
    for part in parts:
        if isinstance(part.get("functionCall"), dict):
            return True
        text = part.get("text")
        if isinstance(text, str) and text.strip() and part.get("thought") is not True:
            return True
    return False


def recall_calls(parts: list[dict[str, Any]]) -> tuple[list[RecallCall], int]:
    """The recall function calls among an answer's parts, each at its part index,
    and the number of visible function calls."""
    recalls: list[RecallCall] = []
    visible = 0
    for position, part in enumerate(parts):
        if is_recall_part(part):
            call = part["functionCall"]
            recalls.append(RecallCall(str(call.get("id") or ""),
                                      orjson.dumps(call.get("args") or {}).decode(), position))
        elif isinstance(part.get("functionCall"), dict):
            visible += 1
    return recalls, visible


def visible_text(parts: list[dict[str, Any]]) -> str:
    """The answer text among parts (thought summaries excluded)."""
    return "".join(p["text"] for p in parts
                   if isinstance(p.get("text"), str) and p.get("thought") is not True)


def sum_usage(rounds: list[dict[str, Any]]) -> dict[str, int]:
    """Add up the ``usageMetadata`` of several rounds."""
    total: dict[str, int] = {}
    for usage in rounds:
        for name in _SUMMED_USAGE_FIELDS:
            value = usage.get(name)
            if isinstance(value, int) and not isinstance(value, bool):
                total[name] = total.get(name, 0) + value
    return total


def answer_parts(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The first candidate's parts of a ``GenerateContentResponse``."""
    candidates = body.get("candidates")
    if not isinstance(candidates, list) or not candidates or not isinstance(candidates[0], dict):
        return []
    content = candidates[0].get("content")
    parts = content.get("parts") if isinstance(content, dict) else None
    return [p for p in parts if isinstance(p, dict)] if isinstance(parts, list) else []


class GeminiRound:
    """Relays one upstream Gemini answer with its recall calls removed.

    The answer itself is the round's :class:`GeminiAccumulator` (``acc``), the
    same reading of the stream storage makes; the round adds only what the
    client sees of it: the hidden parts and the held ``finishReason`` record."""

    def __init__(self, *, hold_terminal: bool = False,
                 max_state_bytes: int = DEFAULT_MAX_STATE_BYTES) -> None:
        # A continuation always holds its finish: that record is rewritten to
        # carry the usage of every round.
        self._hold_terminal = hold_terminal
        self._max_state_bytes = max_state_bytes
        self._state_bytes = 0
        self.acc = GeminiAccumulator()
        self.hidden = 0  # recall calls seen and kept from the client
        self.held: dict[str, Any] | None = None  # the finish record, without recalls
        self.error: dict[str, Any] | None = None  # the upstream's error record, relayed
        self._parts: list[dict[str, Any]] | None = None  # read once the round ended
        self.recalls: list[RecallCall] = []
        self.visible_tools = 0

    @property
    def recall_seen(self) -> bool:
        return self.hidden > 0

    def feed(self, event: SSEEvent) -> bytes:
        """Apply one upstream record; return the bytes the client gets now."""
        if not event.has_data or not event.data.strip():
            return event.raw
        if self.error is not None:
            return b""  # the upstream's error ended the answer (lore-spec D.4)
        self._state_bytes += len(event.data)
        if self._state_bytes > self._max_state_bytes:
            raise StateLimitExceeded(
                f"Gemini recall round exceeds {self._max_state_bytes} bytes")
        try:
            record = orjson.loads(event.data)
        except orjson.JSONDecodeError:
            record = None
        try:
            self.acc.apply(record)
        except ProtocolError:
            if record is None or self.acc.error_event is not record:
                raise
            self.error = record  # the upstream's own error ends the client's stream
            return event.raw
        assert isinstance(record, dict)  # the accumulator refuses anything else
        candidates = record.get("candidates")
        if isinstance(candidates, list) and len(candidates) > 1:
            raise ProtocolError("Gemini recall answers have one candidate")
        candidate = candidates[0] if candidates else None
        shown = record
        if isinstance(candidate, dict):
            parts = answer_parts(record)
            kept = [p for p in parts if not is_recall_part(p)]
            if len(kept) != len(parts):
                self.hidden += len(parts) - len(kept)
                content = {**candidate["content"], "parts": kept}
                shown = {**record, "candidates": [{**candidate, "content": content}]}
            if "finishReason" in candidate and (self.recall_seen or self._hold_terminal):
                self.held = shown
                return b""
        if shown is record:
            return event.raw
        return encode_record(shown) if answer_parts(shown) else b""

    def close(self) -> None:
        """End of the upstream body: the answer must have been finished."""
        if self.error is None:
            self.acc.close()
        body = self.acc.response_body()
        self._parts = answer_parts(body)
        self.recalls, self.visible_tools = recall_calls(self._parts)

    def parts(self) -> list[dict[str, Any]]:
        """The round's accumulated parts, hidden ones included (after ``close``)."""
        assert self._parts is not None, "the round has not ended"
        return self._parts

    def finish_reason(self) -> Any:
        candidates = self.acc.response_body().get("candidates") or [{}]
        return candidates[0].get("finishReason")

    def usable(self) -> bool:
        return content_usable(self.finish_reason(), self.parts())

    def usage(self) -> dict[str, Any]:
        usage = self.acc.response_body().get("usageMetadata")
        return usage if isinstance(usage, dict) else {}

    def can_take(self) -> bool:
        """Whether :meth:`take` may apply: no upstream error, the answer going on."""
        return self.error is None and self.acc.can_take()

    def take(self, data: bytes, max_frames: int) -> tuple[int, int]:
        """The text records at the start of one raw read (``text_records``),
        applied as :meth:`feed` applies each: such a record holds no recall
        call and no ``finishReason``, so it goes out as it came. Stops before
        the state bound; the caller decodes the rest."""
        if not self.can_take():
            return 0, 0
        run = text_records(data, max_frames)
        if run is None or self._state_bytes + run.chars > self._max_state_bytes:
            return 0, 0
        self._state_bytes += run.chars
        self.acc.apply_text_run(run)
        return run.size, len(run.records)


class GeminiRecallStream:
    """What a Gemini client sees of an answer with hidden recalls."""

    def __init__(self, *, max_state_bytes: int = DEFAULT_MAX_STATE_BYTES) -> None:
        self._max_state_bytes = max_state_bytes
        self.round = GeminiRound(max_state_bytes=max_state_bytes)
        self.rounds: list[GeminiRound] = [self.round]

    def feed(self, event: SSEEvent) -> bytes:
        return self.round.feed(event)

    def close_preamble(self) -> bytes:
        """The held finish record's parts, without its ``finishReason``: the
        answer goes on after the recall."""
        held, self.round.held = self.round.held, None
        if held is None or not answer_parts(held):
            return b""
        candidate = {k: v for k, v in held["candidates"][0].items() if k != "finishReason"}
        return encode_record({**held, "candidates": [candidate]})

    def marker_record(self, marker_text: str) -> bytes:
        """A record holding only the marker, set off by blank lines from the
        answer's text around it as a Chat client gets it (``marker_content``):
        a client may merge it with the text parts around it (Gemini CLI does),
        where the blank lines keep it a line of its own."""
        before = "".join(visible_text(r.parts()) for r in self.rounds)
        return encode_record({"candidates": [{"content": {
            "parts": [{"text": marker_content(before, marker_text)}], "role": "model"},
            "index": 0}]})

    def begin_continuation(self) -> None:
        """Start relaying the next upstream answer (a follow-up's stream)."""
        self.round = GeminiRound(hold_terminal=True, max_state_bytes=self._max_state_bytes)
        self.rounds.append(self.round)

    def finish(self) -> bytes:
        """Release the held finish record, with the usage of every round."""
        held, self.round.held = self.round.held, None
        if held is None:
            return b""
        if len(self.rounds) > 1:
            usage = held.get("usageMetadata")
            merged = dict(usage) if isinstance(usage, dict) else {}
            merged.update(sum_usage([r.usage() for r in self.rounds]))
            held = {**held, "usageMetadata": merged}
        return encode_record(held)
