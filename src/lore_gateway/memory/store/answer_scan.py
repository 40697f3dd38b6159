"""The output of a plain Chat or Anthropic answer, or of an untouched Responses
stream, read straight from its bytes.

``lore-store`` parses the raw answers of recall-watched Chat and Anthropic
streams (``collector.raw_outputs``). The protocol accumulators rebuild the
whole response (every choice, block, usage, logprobs and check) through the SSE
decoder, one event object per frame, and at c=16 that was most of a Chat or
Anthropic turn's CPU in the store (docs/benchmarks.md, "lore-store: CPU per
stored turn"). Storage needs only the output messages, and nearly every answer
is text: a Chat stream of ``data: <chunk>`` frames with one choice's
``content`` deltas, an Anthropic stream of text blocks.

``plain_text`` reads exactly such a stream: it cuts the frames itself, decodes
each run of text chunks or deltas without a Python step a frame
(``sse.frame_block``; a loop over the frames was most of the scan's time), and
joins the text pieces. Anything else it might read differently from the
accumulator (tool calls, a refusal, thinking, several choices or messages, an
error event, a frame of another shape, an unfinished stream) returns None, and
the caller parses the stream in full. Equal to the full parse on every stream
shape the fake upstream makes, by test.

A Gemini answer is read by the accumulator the collector uses, without the
SSE decoder: the frames are cut here and each run of text records is applied
in one go (``gemini_stream.text_records``, as a live Gemini round takes them);
a frame of another shape, a failing record or an unfinished answer returns
None.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import msgspec
import orjson

from lore_gateway.protocols import gemini
from lore_gateway.protocols.common import Message, ProtocolError
from lore_gateway.protocols.gemini_stream import GeminiAccumulator, text_records
from lore_gateway.protocols.responses_model import TERMINAL_EVENTS
from lore_gateway.sse import DEFAULT_MAX_EVENT_BYTES, DEFAULT_MAX_FRAMES, frame_block, json_values

_Unsure = ValueError  # raised inside a scan: the caller parses in full


def plain_text(family: str, body: bytes) -> list[Message] | None:
    """The output messages of a plain text answer, as the collector would read
    them; None when the stream is not of that shape."""
    if family == "gemini":
        return _gemini(body)
    if (b"\r" in body or len(body) > DEFAULT_MAX_EVENT_BYTES
            or not body.endswith(b"\n\n")):
        return None
    try:
        if not body.isascii():
            body.decode()  # msgspec does not check the text of what it skips
        if family == "chat":
            texts = _chat(body)
        elif family == "anthropic":
            frames = body[:-2].split(b"\n\n")
            if len(frames) > DEFAULT_MAX_FRAMES:
                return None
            texts = _anthropic(frames)
        else:
            return None
    except (ValueError, msgspec.DecodeError):  # orjson's errors are ValueErrors
        return None
    return [Message("assistant", text) for text in texts if text]


def _gemini(body: bytes) -> list[Message] | None:
    """A Gemini stream of ``data: <record>`` frames, each ended by a CRLF blank
    line as the API ends them, read by the accumulator the collector uses: its
    runs of text records in one go (``text_records``), any other record parsed
    alone. None when a frame is of another shape, a record fails, or the
    answer did not finish: the collector reads the stream then."""
    if len(body) > DEFAULT_MAX_EVENT_BYTES or not body.endswith(_GEMINI_END):
        return None
    if not body.isascii():
        try:
            body.decode()
        except UnicodeDecodeError:
            return None
    acc = GeminiAccumulator()
    pos = frames = 0
    try:
        while pos < len(body):
            if frames >= DEFAULT_MAX_FRAMES:
                return None
            run = text_records(body, DEFAULT_MAX_FRAMES - frames, pos) if acc.can_take() else None
            if run is not None:
                acc.apply_text_run(run)
                pos += run.size
                frames += len(run.records)
                continue
            end = body.find(_GEMINI_END, pos)
            line = body[pos:end]
            if not line.startswith(b"data: ") or b"\n" in line or b"\r" in line:
                return None
            acc.apply(orjson.loads(line[6:]))
            pos = end + len(_GEMINI_END)
            frames += 1
        acc.close()
        return gemini.output_messages(acc)
    except (ProtocolError, ValueError):  # orjson's errors are ValueErrors
        return None


_GEMINI_END = b"\r\n\r\n"


def _json(payload: bytes) -> dict[str, Any]:
    found = orjson.loads(payload)
    if not isinstance(found, dict):
        raise _Unsure
    return found


def _is_index(value: object, expected: int) -> bool:
    """An int equal to ``expected`` (a JSON ``true`` is not an index)."""
    return type(value) is int and value == expected


class _ChatDelta(msgspec.Struct):
    content: str | None = None
    tool_calls: Annotated[list[Any], msgspec.Meta(max_length=0)] | None = None
    refusal: None = None


class _ChatChoice(msgspec.Struct):
    delta: _ChatDelta | None = None
    index: Literal[0] = 0


class _ChatChunk(msgspec.Struct):
    """What the scan reads of a chunk; the rest is checked, not built. Typed
    strictly, so that only a plain answer's chunk decodes: at most one choice,
    at index 0, with no refusal and no tool call, and no error at all (not even
    ``null``: ``UnsetType`` admits no value). Anything else fails the decoding,
    and the stream goes to the full parse."""

    choices: Annotated[list[_ChatChoice], msgspec.Meta(max_length=1)] | None = None
    error: msgspec.UnsetType = msgspec.UNSET


_decode_chat = msgspec.json.Decoder(_ChatChunk).decode
_CHAT_DONE = b"data: [DONE]\n\n"


def _chat(body: bytes) -> list[str]:
    """Frames of ``data: <chunk>`` up to ``data: [DONE]``, decoded as one run."""
    end = len(body) - len(_CHAT_DONE)
    if not body.endswith(_CHAT_DONE) or (end and body[end - 2:end] != b"\n\n"):
        raise _Unsure
    if not end:
        return [""]
    block = frame_block(body, end, b"data: ", DEFAULT_MAX_FRAMES - 1, _decode_chat)
    if block is None:
        raise _Unsure
    return ["".join([choice.delta.content or "" for chunk in block.values if chunk.choices
                     for choice in chunk.choices if choice.delta is not None])]


class _TextDelta(msgspec.Struct):
    type: Literal["text_delta"]
    text: str | None = None


class _DeltaEvent(msgspec.Struct):
    """A ``content_block_delta`` as the scan reads it, typed strictly (a delta
    of another shape fails the decoding: the full parse reads it)."""

    type: Literal["content_block_delta"]
    index: int
    delta: _TextDelta


_decode_anthropic_delta = msgspec.json.Decoder(_DeltaEvent).decode
_DELTA_FRAME = b"event: content_block_delta\ndata: "


def _anthropic(frames: list[bytes]) -> list[str]:
    """One message of text blocks, opened and closed in index order, then
    ``message_stop``; pings and ``message_delta`` anywhere before it."""
    blocks: list[list[str]] = []
    open_block: list[str] | None = None
    started = stopped = False
    at = 0
    while at < len(frames):
        frame = frames[at]
        if frame.startswith(_DELTA_FRAME) and started and not stopped:  # most frames
            run = at + 1
            while run < len(frames) and frames[run].startswith(_DELTA_FRAME):
                run += 1
            open_block = _text_deltas(frames[at:run], open_block, len(blocks) - 1)
            at = run
            continue
        at += 1
        if not frame.startswith(b"event: "):
            raise _Unsure
        nl = frame.find(b"\n")
        if nl == -1 or not frame.startswith(b"data: ", nl + 1) or b"\n" in frame[nl + 1:]:
            raise _Unsure
        name = frame[7:nl].decode()
        event = _json(frame[nl + 7:])
        if event.get("type") != name:
            raise _Unsure
        if name == "ping":
            continue
        if stopped:
            raise _Unsure
        if name == "message_start":
            if started or not isinstance(event.get("message"), dict):
                raise _Unsure
            started = True
        elif not started:
            raise _Unsure
        elif name == "content_block_start":
            block = event.get("content_block")
            if (open_block is not None or not _is_index(event.get("index"), len(blocks))
                    or not isinstance(block, dict)
                    or block.get("type") != "text" or not isinstance(block.get("text"), str)):
                raise _Unsure
            open_block = [block["text"]]
            blocks.append(open_block)
        elif name == "content_block_stop":
            if open_block is None or not _is_index(event.get("index"), len(blocks) - 1):
                raise _Unsure
            open_block = None
        elif name == "message_stop":
            stopped = True
        elif name != "message_delta":
            raise _Unsure
    if not stopped or open_block is not None:
        raise _Unsure
    return ["".join(parts) for parts in blocks]


def _text_deltas(run: list[bytes], open_block: list[str] | None, index: int) -> list[str]:
    """A run of ``content_block_delta`` frames, decoded as one run: each a
    text delta of the open block ``index``; the block with their text added."""
    deltas = json_values([frame[len(_DELTA_FRAME):] for frame in run], _decode_anthropic_delta)
    if open_block is None or deltas is None:
        raise _Unsure
    if any(d.index != index for d in deltas):
        raise _Unsure
    open_block.append("".join([d.delta.text or "" for d in deltas]))
    return open_block


def responses_output(body: bytes) -> list[Message] | None:
    """The output messages of a Responses stream, read from its last frame: the
    terminal, whose ``response.output`` repeats every item the stream built.

    Either that frame alone, from a stream the gateway relayed untouched
    (``recall/responses/gate.py``, which checked the output is whole), or a
    whole stream a plain relay kept (``proxy``): then it must hold one
    ``response.created``, one terminal, no ``error`` event and as many
    ``output_item.done`` events as the output has items (a stream of several
    responses, or one whose terminal leaves items out, is parsed in full). None
    for any other stream (parsed in full)."""
    terminal = last_terminal(body)
    if terminal is None:
        return None
    name, data, alone = terminal
    try:
        payload = _json(data)
    except ValueError:
        return None
    response = payload.get("response")
    if payload.get("type") != name or not isinstance(response, dict):
        return None
    output = response.get("output")
    if not isinstance(output, list) or not output or not all(
            isinstance(item, dict) for item in output):
        return None
    if not alone and not _one_whole_response(body, len(output)):
        return None
    from lore_gateway.recall.responses.stored import turn_messages

    return turn_messages(output)


_TERMINAL_NAMES = {name.encode(): name for name in TERMINAL_EVENTS}


def last_terminal(body: bytes) -> tuple[str, bytes, bool] | None:
    """The event name and JSON of a Responses stream's last frame when it is a
    terminal event of the usual shape (``event:`` + one ``data:`` line, LF
    endings), and whether it is the stream's only frame; None otherwise."""
    if b"\r" in body or not body.endswith(b"\n\n"):
        return None
    start = body.rfind(b"\n\n", 0, len(body) - 2)
    line, sep, data = body[start + 2 if start != -1 else 0 : -2].partition(b"\ndata: ")
    name = _TERMINAL_NAMES.get(line[7:]) if line.startswith(b"event: ") else None
    if name is None or not sep or b"\n" in data:
        return None
    return name, data, start == -1


# The events whose frames decide whether a whole Responses stream is one
# response: its start, its end, an error, and its finished items. One regular
# expression finds them all in one pass (each ``bytes.count`` is a pass).
_COUNTED = b"(" + b"|".join(re.escape(name.encode()) for name in sorted(
    {"error", "response.created", "response.output_item.done", *TERMINAL_EVENTS})) + b")\n"
_COUNTED_AFTER_FIRST = re.compile(rb"\n\nevent: " + _COUNTED)
_COUNTED_FIRST = re.compile(rb"event: " + _COUNTED)


@dataclass(frozen=True, slots=True)
class FrameCounts:
    """How many frames of an LF-framed Responses stream are of each kind."""

    created: int
    terminals: int
    errors: int
    items_done: int


def frame_counts(body: bytes) -> FrameCounts:
    names = _COUNTED_AFTER_FIRST.findall(body)
    first = _COUNTED_FIRST.match(body)
    if first is not None:
        names.append(first.group(1))
    done = names.count(b"response.output_item.done")
    created = names.count(b"response.created")
    errors = names.count(b"error")
    return FrameCounts(created, len(names) - done - created - errors, errors, done)


def _one_whole_response(body: bytes, items: int) -> bool:
    """Whether a whole Responses stream is one response whose terminal repeats
    each of its ``items`` finished items."""
    counts = frame_counts(body)
    return (counts.created == 1 and counts.terminals == 1 and not counts.errors
            and counts.items_done == items)
