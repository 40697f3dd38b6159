"""Google Gemini ``generateContent``: the stream's accumulator (sans-IO).

Every record of a Gemini stream has the shape of the whole answer, a
``GenerateContentResponse`` (``candidates``, ``usageMetadata``,
``modelVersion``, ``responseId``, ``promptFeedback``); a record adds the parts
generated since the previous one. ``:streamGenerateContent?alt=sse`` sends one
record a data-only SSE frame (``data: {...}`` and a CRLF blank line);
without ``alt=sse`` it sends one JSON array, streamed element by element
(``[{...}\\r\\n,\\r\\n{...}]``), which :class:`JsonArrayDecoder` cuts into its
records. A non-streamed ``:generateContent`` answer is one record.

:class:`GeminiAccumulator` is the Gemini ``StreamAccumulator``
(``protocols/accumulator.py``): storage and the live recall rounds apply the
records with one set of rules. Text parts of a candidate are concatenated into
one part per run (a thought summary's run apart from the answer's), function
calls arrive whole, one per part. There is no terminal frame: the record that
carries a candidate's ``finishReason`` (or the prompt's ``blockReason``) ends
the answer, and a stream closed before it is incomplete. An ``error`` record
(the API's ``{"error": {"code", "message", "status"}}``) fails the stream, as
the Chat Completions accumulator fails on an error chunk.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Annotated, Any

import msgspec
import orjson

from lore_gateway.protocols.accumulator import StateLimitExceeded
from lore_gateway.protocols.common import ProtocolError, TextBuffer, ToolCall
from lore_gateway.protocols.usage import Usage
from lore_gateway.sse import DEFAULT_MAX_EVENT_BYTES, SSEEvent, text_chars

# Parts that are not text (function calls, inline data, code) one answer may
# hold. An agent's turn makes a few dozen calls; the bound stops a broken or
# hostile upstream from growing the state without end while the relay goes on.
MAX_PARTS = 4_096
# Candidates one answer may hold (``candidateCount`` is at most 8 in the API).
MAX_CANDIDATES = 8
# One record of an array stream, as large as one SSE event may be (sse.py).
MAX_RECORD_BYTES = DEFAULT_MAX_EVENT_BYTES

BROKEN_RECORD = "malformed JSON in Gemini stream record"
STREAM_ERROR = "Gemini stream error"
NO_FINISH = "Gemini stream ended without a finishReason"

# --- a run of text records, read in one go ----------------------------------------
#
# Most of a streamed answer is records that only add text to the one candidate.
# Parsing each into dicts and walking them is most of what watching a Gemini
# stream costs (issue 35), so a run of them is decoded in C by msgspec, with
# types that admit nothing the general path would treat differently: any other
# key (``finishReason``, ``thought``, ``functionCall``, ``error``, ...), a null,
# another type, a second candidate refuses the whole run, and the general path
# reads it as before. ``usageMetadata`` is typed as the API sends it (counts,
# strings, lists of per-modality counts), with counts in the range orjson reads
# as integers: so msgspec gives exactly the dict orjson gives, or refuses.


class _TextPart(msgspec.Struct, forbid_unknown_fields=True):
    text: str


class _TextContent(msgspec.Struct, forbid_unknown_fields=True):
    parts: list[_TextPart] = []
    role: str | None = None  # a null is ignored, as the general path ignores it


class _TextCandidate(msgspec.Struct, forbid_unknown_fields=True):
    content: _TextContent
    index: int = 0


# orjson reads an integer outside int64 and uint64 as a float (a uint64 past
# int64 is refused here too: msgspec bounds only int64).
_Count = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]
_UsageValue = _Count | str | list[dict[str, _Count | str]]


class _TextRecord(msgspec.Struct, forbid_unknown_fields=True):
    candidates: list[_TextCandidate]
    usageMetadata: dict[str, _UsageValue] | None = None  # a null is ignored, as there
    modelVersion: str | None = None
    responseId: str | None = None
    createTime: str | None = None


_decode_text_record = msgspec.json.Decoder(_TextRecord).decode
_RECORD_PREFIX = b"data: "
_RECORD_END = b"\r\n\r\n"  # the Gemini API ends its frames with CRLF
_RECORD_SEPARATOR = _RECORD_END + _RECORD_PREFIX
# Where a run of text records must end: the general path reads these frames.
_RUN_ENDS = (b'"finishReason"', b'"functionCall"')


@dataclass(frozen=True, slots=True)
class TextRun:
    """Whole text records at the start of a read (:func:`text_records`)."""

    records: list[_TextRecord]
    usage: dict[str, Any] | None  # the last record's ``usageMetadata`` that has one
    size: int  # bytes of their frames, from the start of the read
    chars: int  # characters of their payloads (``len(event.data)`` summed)


def text_records(data: bytes, max_frames: int, start: int = 0) -> TextRun | None:
    """The whole frames at ``start`` in ``data``, before any that may end the
    answer or call a function, when every one is ``data: `` and a record that
    only adds text to candidate 0 (a CRLF blank line after it, UTF-8, at most
    ``max_frames``); None otherwise. ``size`` counts from ``start``."""
    end = len(data)
    for trigger in _RUN_ENDS:
        found = data.find(trigger, start, end)
        if found != -1:
            end = found
    cut = data.rfind(_RECORD_END, start, end) + len(_RECORD_END)
    if cut < start + len(_RECORD_END) or not data.startswith(_RECORD_PREFIX, start):
        return None
    body = data[start + len(_RECORD_PREFIX) : cut - len(_RECORD_END)]
    payloads = body.split(_RECORD_SEPARATOR)
    frames = len(payloads)
    if frames > max_frames:
        return None
    # Line breaks only in the separators: one data line a frame, nothing else.
    # (A copy and two memchr: bytes.count of one byte is a loop a byte.)
    joined = b"".join(payloads) if frames > 1 else body
    if b"\n" in joined or b"\r" in joined:
        return None
    try:
        records = list(map(_decode_text_record, payloads))
    except msgspec.DecodeError:
        return None
    usage: dict[str, Any] | None = None
    for record in records:
        candidates = record.candidates
        if len(candidates) != 1 or candidates[0].index != 0:
            return None
        if record.usageMetadata is not None:
            usage = record.usageMetadata
    chars = text_chars(body)
    if chars is None:
        return None
    return TextRun(records, usage, cut - start, chars - (frames - 1) * len(_RECORD_SEPARATOR))


def usage_from_gemini(meta: dict[str, Any]) -> Usage:
    """``usageMetadata`` in the disjoint convention: ``promptTokenCount`` includes
    ``cachedContentTokenCount`` (as OpenAI's input does); thinking tokens
    (``thoughtsTokenCount``) are output, counted apart from ``candidatesTokenCount``."""
    prompt = _count(meta, "promptTokenCount") or 0
    cached = _count(meta, "cachedContentTokenCount")
    thoughts = _count(meta, "thoughtsTokenCount")
    output = (_count(meta, "candidatesTokenCount") or 0) + (thoughts or 0)
    return Usage(input_tokens=max(prompt - (cached or 0), 0), output_tokens=output,
                 cache_read=cached, reasoning_tokens=thoughts)


def _count(meta: dict[str, Any], key: str) -> int | None:
    value = meta.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ProtocolError(f"Gemini usageMetadata.{key} is not a non-negative integer")
    return value


@dataclass(frozen=True, slots=True)
class GeminiResult:
    """The answer accumulated so far, read out (first candidate)."""

    id: str  # responseId
    model: str  # modelVersion
    finish_reason: str | None
    text: str  # the answer's text parts, thought summaries excluded
    thoughts: str  # the thought summaries' text
    tool_calls: list[ToolCall]
    usage: Usage | None
    body: dict[str, Any] = field(repr=False)  # the GenerateContentResponse


class _Candidate:
    """One candidate's content: merged parts and its other fields as last sent."""

    __slots__ = ("extra", "finish", "parts", "role")

    def __init__(self) -> None:
        # Each entry: a text run (its TextBuffer, thought flag, other keys) or a part.
        self.parts: list[tuple[TextBuffer, bool, dict[str, Any]] | dict[str, Any]] = []
        self.role = "model"
        self.finish: str | None = None
        self.extra: dict[str, Any] = {}

    def part_dicts(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for part in self.parts:
            if isinstance(part, tuple):
                buf, thought, rest = part
                built: dict[str, Any] = {"text": buf.value, **rest}
                if thought:
                    built["thought"] = True
                out.append(built)
            else:
                out.append(part)
        return out


class GeminiAccumulator:
    """One Gemini answer, record by record: ``feed_event`` for an SSE frame,
    ``apply`` for a record however it came (an array element, a whole body).

    ``max_text_chars`` bounds the text kept per run (storage); None keeps all.
    Raises ``ProtocolError`` on a broken record or an error record and is then
    unusable, like every accumulator here."""

    def __init__(self, *, max_text_chars: int | None = None) -> None:
        self.error_event: dict[str, Any] | None = None
        self._limit = max_text_chars
        self._candidates: dict[int, _Candidate] = {}
        self._usage: dict[str, Any] | None = None
        self._head: dict[str, Any] = {}
        self._prompt_feedback: dict[str, Any] | None = None
        self._other_parts = 0
        self._done = False
        self._broken: str | None = None

    @property
    def done(self) -> bool:
        return self._done

    def can_take(self) -> bool:
        """Whether :meth:`apply_text_run` may apply: the answer still going, and
        room for candidate 0 and one more part (a bound is met on the general
        path, at the record that meets it)."""
        return (self._broken is None and not self._done and self._other_parts < MAX_PARTS
                and (0 in self._candidates or len(self._candidates) < MAX_CANDIDATES))

    def apply_text_run(self, run: TextRun) -> None:
        """Apply a run of text records (:func:`text_records`) as :meth:`apply`
        applies each: their head fields, the last usage, one text run."""
        self._check()
        texts: list[str] = []
        role: str | None = None
        for record in run.records:
            if record.responseId is not None:
                self._head["responseId"] = record.responseId
            if record.modelVersion is not None:
                self._head["modelVersion"] = record.modelVersion
            if record.createTime is not None:
                self._head["createTime"] = record.createTime
            content = record.candidates[0].content
            if content.role is not None:
                role = content.role
            texts.extend([part.text for part in content.parts])
        if run.usage is not None:
            self._usage = run.usage
        state = self._candidate(0)
        if role is not None:
            state.role = role
        if texts:
            # Consecutive plain text parts make one run: one append is all of theirs.
            text = "".join(texts)
            self._append_text(state, {"text": text}, text)

    def feed_event(self, event: SSEEvent) -> None:
        if not event.has_data or not event.data.strip():
            return
        self._check()
        try:
            record = orjson.loads(event.data)
        except orjson.JSONDecodeError:
            self._fail(BROKEN_RECORD)
        self.apply(record)

    def feed_record(self, data: bytes) -> None:
        """One element of an array stream (``JsonArrayDecoder``), as bytes."""
        self._check()
        try:
            record = orjson.loads(data)
        except orjson.JSONDecodeError:
            self._fail(BROKEN_RECORD)
        self.apply(record)

    def apply(self, record: Any) -> None:
        """Apply one ``GenerateContentResponse`` record."""
        self._check()
        if not isinstance(record, dict):
            self._fail(BROKEN_RECORD)
        if "error" in record:
            self.error_event = record
            self._fail(STREAM_ERROR)
        for key in ("responseId", "modelVersion", "createTime"):
            if isinstance(record.get(key), str):
                self._head[key] = record[key]
        usage = record.get("usageMetadata")
        if isinstance(usage, dict):
            self._usage = usage
        feedback = record.get("promptFeedback")
        if isinstance(feedback, dict):
            self._prompt_feedback = feedback
            if feedback.get("blockReason"):
                self._done = True
        candidates = record.get("candidates")
        if candidates is None:
            return
        if not isinstance(candidates, list):
            self._fail(BROKEN_RECORD)
        for candidate in candidates:
            if not isinstance(candidate, dict):
                self._fail(BROKEN_RECORD)
            self._apply_candidate(candidate)

    def _apply_candidate(self, wire: dict[str, Any]) -> None:
        index = wire.get("index", 0)
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            self._fail(BROKEN_RECORD)
        state = self._candidate(index)
        for key, value in wire.items():
            if key == "content":
                self._apply_content(state, value)
            elif key == "finishReason":
                if isinstance(value, str) and value:
                    state.finish = value
                    self._done = True
            elif key != "index":
                state.extra[key] = value

    def _candidate(self, index: int) -> _Candidate:
        state = self._candidates.get(index)
        if state is None:
            if len(self._candidates) >= MAX_CANDIDATES:
                self._limit_hit(f"more than {MAX_CANDIDATES} Gemini candidates")
            state = self._candidates[index] = _Candidate()
        return state

    def _apply_content(self, state: _Candidate, content: Any) -> None:
        if not isinstance(content, dict):
            self._fail(BROKEN_RECORD)
        if isinstance(content.get("role"), str):
            state.role = content["role"]
        parts = content.get("parts")
        if parts is None:
            return
        if not isinstance(parts, list):
            self._fail(BROKEN_RECORD)
        for part in parts:
            if not isinstance(part, dict):
                self._fail(BROKEN_RECORD)
            text = part.get("text")
            if isinstance(text, str):
                self._append_text(state, part, text)
                continue
            self._other_parts += 1
            if self._other_parts > MAX_PARTS:
                self._limit_hit(f"more than {MAX_PARTS} Gemini parts")
            state.parts.append(part)

    def _append_text(self, state: _Candidate, part: dict[str, Any], text: str) -> None:
        thought = part.get("thought") is True
        rest = {k: v for k, v in part.items() if k not in ("text", "thought")}
        last = state.parts[-1] if state.parts else None
        # A run continues while the flag is the same; a signature closes it (it
        # belongs to the text before it, and is kept where it came).
        if (isinstance(last, tuple) and last[1] == thought
                and "thoughtSignature" not in last[2]
                and set(rest) <= {"thoughtSignature"}):
            last[0].append(text)
            last[2].update(rest)
            return
        self._other_parts += 1
        if self._other_parts > MAX_PARTS:
            self._limit_hit(f"more than {MAX_PARTS} Gemini parts")
        state.parts.append((TextBuffer(text, limit=self._limit), thought, rest))

    def close(self) -> None:
        self._check()
        if not self._done:
            self._fail(NO_FINISH)

    def result(self) -> GeminiResult:
        first = self._candidates.get(0)
        if first is None and self._candidates:
            first = self._candidates[min(self._candidates)]
        texts: list[str] = []
        thoughts: list[str] = []
        calls: list[ToolCall] = []
        if first is not None:
            for part in first.parts:
                if isinstance(part, tuple):
                    (thoughts if part[1] else texts).append(part[0].value)
                elif isinstance(call := part.get("functionCall"), dict):
                    calls.append(_tool_call(call))
        usage = usage_from_gemini(self._usage) if self._usage is not None else None
        return GeminiResult(
            id=str(self._head.get("responseId", "")),
            model=str(self._head.get("modelVersion", "")),
            finish_reason=first.finish if first is not None else None,
            text="".join(texts), thoughts="".join(thoughts), tool_calls=calls,
            usage=usage, body=self.response_body())

    def response_body(self) -> dict[str, Any]:
        body: dict[str, Any] = {}
        if self._candidates:
            body["candidates"] = [_candidate_body(index, state)
                                  for index, state in sorted(self._candidates.items())]
        if self._prompt_feedback is not None:
            body["promptFeedback"] = self._prompt_feedback
        if self._usage is not None:
            body["usageMetadata"] = self._usage
        for key in ("modelVersion", "createTime", "responseId"):
            if key in self._head:
                body[key] = self._head[key]
        return body

    def _check(self) -> None:
        if self._broken is not None:
            raise ProtocolError(self._broken)

    def _fail(self, message: str) -> Any:
        self._broken = message
        raise ProtocolError(message)

    def _limit_hit(self, message: str) -> None:
        self._broken = message
        raise StateLimitExceeded(message)


def _candidate_body(index: int, state: _Candidate) -> dict[str, Any]:
    out: dict[str, Any] = {"content": {"parts": state.part_dicts(), "role": state.role}}
    if state.finish is not None:
        out["finishReason"] = state.finish
    out.update(state.extra)
    out["index"] = index
    return out


def _tool_call(call: dict[str, Any]) -> ToolCall:
    args = call.get("args")
    return ToolCall(call_id=str(call.get("id") or ""), name=str(call.get("name") or ""),
                    arguments=json.dumps(args if args is not None else {},
                                         ensure_ascii=False))


class JsonArrayDecoder:
    """Cuts a streamed JSON array (``streamGenerateContent`` without ``alt=sse``)
    into the bytes of its elements, incrementally: bytes in, whole records out.

    It tracks only strings, escapes and bracket depth; each element is parsed
    later (``GeminiAccumulator.feed_record``). An element over
    ``MAX_RECORD_BYTES``, bytes outside the array, or an array never closed
    raise ``ProtocolError``."""

    __slots__ = ("_buf", "_closed", "_depth", "_escape", "_opened", "_start", "_string")

    def __init__(self) -> None:
        self._buf = bytearray()
        self._opened = False
        self._closed = False
        self._depth = 0  # inside the array's elements (the array itself not counted)
        self._string = False
        self._escape = False
        self._start = -1

    def feed(self, data: bytes) -> list[bytes]:
        out: list[bytes] = []
        base = len(self._buf)
        self._buf += data
        pos = base
        buf = self._buf
        for pos in range(base, len(buf)):
            byte = buf[pos]
            if self._string:
                if self._escape:
                    self._escape = False
                elif byte == 0x5C:  # backslash
                    self._escape = True
                elif byte == 0x22:
                    self._string = False
                continue
            if byte in b" \t\r\n":
                continue
            if not self._opened:
                if byte != 0x5B:
                    raise ProtocolError("Gemini array stream does not start with '['")
                self._opened = True
                continue
            if self._closed:
                raise ProtocolError("Gemini array stream has data after its ']'")
            if self._depth == 0:
                if byte == 0x2C:  # the comma between elements
                    continue
                if byte == 0x5D:
                    self._closed = True
                    continue
                if byte != 0x7B:
                    raise ProtocolError("Gemini array stream record is not an object")
                self._start = pos
            if byte == 0x22:
                self._string = True
            elif byte in b"{[":
                self._depth += 1
            elif byte in b"}]":
                self._depth -= 1
                if self._depth == 0:
                    out.append(bytes(buf[self._start:pos + 1]))
                    self._start = -1
        keep = self._start if self._start >= 0 else len(buf)
        del self._buf[:keep]
        if self._start >= 0:
            self._start = 0
        if len(self._buf) > MAX_RECORD_BYTES:
            raise ProtocolError(f"Gemini stream record exceeds {MAX_RECORD_BYTES} bytes")
        return out

    def close(self) -> None:
        if not self._closed:
            raise ProtocolError("Gemini array stream ended before its ']'")
