"""Incremental Server-Sent Events decoder and encoder (sans-IO).

The decoder takes bytes as they arrive and returns whole frames. Every frame is
returned, comment-only and empty ones included, each with the exact bytes it was
made of: the concatenation of ``raw`` over all frames (plus whatever
``close()`` returns) is the input, so a relay can forward the frames it does not
change byte for byte.

Parsing follows the WHATWG event-stream rules with the hardening of lore-spec
D.1: any mix of CRLF, LF and CR line endings, a UTF-8 BOM stripped once at the
start (even when split across chunks), and limits on the number of frames, the
size of one event and the total size, each failing with an exact message.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, NamedTuple, TypeVar

import msgspec

from lore_gateway.protocols.common import ProtocolError

MiB = 1024 * 1024

# Real provider streams have a few thousand frames at most; 100k bounds a
# hostile or looping upstream without ever touching a legitimate answer.
DEFAULT_MAX_FRAMES = 100_000

T = TypeVar("T")
# The largest legitimate single event is a terminal that repeats the whole
# output (response.completed); 4 MiB matches the reference gateway.
DEFAULT_MAX_EVENT_BYTES = 4 * MiB

_BOM = b"\xef\xbb\xbf"
_CR = 0x0D
_LF = 0x0A


class SSELimitError(ProtocolError):
    """A stream exceeded one of the decoder's limits. Never retried."""


class SSEEvent(NamedTuple):
    """One SSE frame (a named tuple: immutable, and built several times faster than
    a frozen dataclass, which matters at one per upstream event).

    ``event`` is the value of the ``event:`` field, or None when the frame has
    none. ``data`` is the ``data:`` lines joined with ``"\\n"``; ``has_data`` is
    False for frames made only of comments or unknown fields. ``raw`` is the
    frame exactly as received, including its terminating blank line.
    """

    event: str | None
    data: str
    has_data: bool
    raw: bytes

    @property
    def name(self) -> str:
        """The event type as a client dispatches it (``message`` by default)."""
        return self.event or "message"


class SSEDecoder:
    """Turns a byte stream into :class:`SSEEvent` frames, incrementally."""

    def __init__(
        self,
        *,
        max_frames: int = DEFAULT_MAX_FRAMES,
        max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
        max_total_bytes: int | None = None,
        require_terminator: bool = False,
        skip_suffix: bytes | None = None,
    ) -> None:
        """``skip_suffix``: frames of the usual ``event: <name>`` shape whose name ends
        with it are counted against the limits but not returned (nor decoded), for a
        reader that never looks at them (storage skips Responses ``*.delta`` events,
        most of a stream). Other line endings still return them: the reader filters
        by name as well."""
        self._max_frames = max_frames
        self._max_event_bytes = max_event_bytes
        self._max_total_bytes = max_total_bytes
        self._require_terminator = require_terminator
        self._skip_suffix = skip_suffix
        self._buf = bytearray()
        self._pos = 0  # start of the first unparsed line in _buf
        self._frame_start = 0  # start of the current frame in _buf
        self._lines: list[bytes] = []
        self._frames = 0
        self._total = 0
        self._bom_checked = False
        self._skip = 0  # BOM bytes at the start of the current frame's raw
        self._closed = False

    @property
    def frames(self) -> int:
        return self._frames

    @property
    def idle(self) -> bool:
        """Whether nothing received is pending: the next byte starts a frame."""
        return not self._buf and not self._closed and (self._bom_checked or not self._total)

    @property
    def frame_room(self) -> int:
        """How many more frames the stream may have."""
        return self._max_frames - self._frames

    def count(self, frames: int, size: int) -> None:
        """Frames read past the decoder (at most ``frame_room``), counted as if
        it had read them; only while :attr:`idle`."""
        assert self.idle and frames <= self.frame_room
        self._bom_checked = True
        self._frames += frames
        self._total += size

    def pending_end(self, data: bytes) -> int:
        """How much of ``data`` finishes the frame pending here: up to and
        including its blank line, when LF line endings tell at a glance (then
        feeding that much leaves the decoder :attr:`idle`); -1 otherwise
        (nothing pending, a CR, no blank line in ``data``). A reader that
        takes whole frames past the decoder goes on from there, not from the
        next read."""
        buf = self._buf
        if self._frame_start >= len(buf) or self._lines or self._closed or not self._bom_checked:
            return -1
        if buf[-1] == _LF and data[:1] == b"\n":
            end = 1
        else:
            end = data.find(b"\n\n") + 2
            if end == 1:
                return -1
        if data.find(b"\r", 0, end) != -1 or buf.find(b"\r", self._frame_start) != -1:
            return -1
        return end

    def detach(self) -> bytes | None:
        """Hand over what is pending, for a reader that goes on from here without
        this decoder: the start of an unfinished frame (``b""`` if none). None,
        and nothing changes, while that is not possible: the BOM not settled
        yet, or a frame partly parsed (other line endings than LF)."""
        if not self._bom_checked or self._lines or self._closed:
            return None
        pending = bytes(self._buf[self._frame_start :])
        self._buf.clear()
        self._pos = self._frame_start = self._skip = 0
        self._closed = True
        return pending

    def feed(self, data: bytes) -> list[SSEEvent]:
        """Add received bytes; return the frames they completed."""
        if self._closed:
            raise RuntimeError("SSEDecoder.feed() called after close()")
        self._total += len(data)
        if self._max_total_bytes is not None and self._total > self._max_total_bytes:
            raise SSELimitError("SSE stream exceeded aggregate byte limit")
        # Nothing pending, LF endings, no BOM (and ``bytes``, so that every raw
        # frame is ``bytes`` whatever a caller passes): cut up where it lies.
        if not self._buf and isinstance(data, bytes) and data.find(b"\r") == -1 and (
                self._bom_checked or (len(data) >= len(_BOM) and not data.startswith(_BOM))):
            self._bom_checked = True
            return self._parse_lf_bytes(data)
        self._buf += data
        if not self._bom_checked:
            if len(self._buf) < len(_BOM) and _BOM.startswith(bytes(self._buf)):
                return []
            self._bom_checked = True
            if self._buf.startswith(_BOM):
                self._pos = self._skip = len(_BOM)
        events = self._parse(final=False)
        if len(self._buf) - self._frame_start > self._max_event_bytes:
            raise SSELimitError(f"SSE event exceeded {self._max_event_bytes} byte limit")
        return events

    def close(self) -> list[SSEEvent]:
        """Signal end of stream; return a final unterminated frame, if any."""
        if self._closed:
            return []
        self._closed = True
        events = self._parse(final=True)
        rest = bytes(self._buf[self._frame_start :])
        if rest:
            content = rest[self._skip :] if self._frame_start == 0 else rest
            if content.strip(b"\r\n") and self._require_terminator:
                raise ProtocolError("unterminated SSE event at EOF")
            if self._pos < len(self._buf):
                self._lines.append(bytes(self._buf[self._pos :]))
            events.append(self._build(rest))
        self._buf.clear()
        return events

    def _parse(self, *, final: bool) -> list[SSEEvent]:
        if not final and not self._lines and self._buf.find(b"\r", self._pos) == -1:
            return self._parse_lf()
        buf = self._buf
        pos = self._pos
        events: list[SSEEvent] = []
        end = len(buf)
        while pos < end:
            lf = buf.find(b"\n", pos)
            cr = buf.find(b"\r", pos, lf if lf != -1 else end)
            if cr != -1:
                if cr + 1 == end and not final:
                    break  # a CR at the end may be the first half of CRLF
                line_end = cr
                next_pos = cr + 2 if cr + 1 < end and buf[cr + 1] == _LF else cr + 1
            elif lf != -1:
                line_end, next_pos = lf, lf + 1
            else:
                break
            if line_end == pos:
                raw = bytes(buf[self._frame_start : next_pos])
                events.append(self._build(raw))
                self._frame_start = next_pos
            else:
                self._lines.append(bytes(buf[pos:line_end]))
            pos = next_pos
        self._pos = pos
        self._compact()
        return events

    def _parse_lf_bytes(self, data: bytes) -> list[SSEEvent]:
        """``_parse_lf`` over a chunk that starts on a frame boundary with nothing
        pending, the usual case: frames of the two usual shapes (see
        ``_one_data_line``) are cut from ``data`` itself, one copy each instead of
        two through the buffer, and decoded inline (this runs once per upstream
        event). From the first frame of another shape, or an unfinished one, the
        rest of the chunk goes through the buffer and ``_parse_lf``."""
        events: list[SSEEvent] = []
        find = data.find
        startswith = data.startswith
        skip = self._skip_suffix
        max_event = self._max_event_bytes
        max_frames = self._max_frames
        frames = self._frames
        size = len(data)
        pos = 0
        try:
            while pos < size:
                if startswith(b"event: ", pos):
                    end = find(b"\n\n", pos)
                    if end == -1:
                        break
                    nl = find(b"\n", pos, end)
                    event: SSEEvent | None = None  # None: skipped, counted but not returned
                    if skip is None or not data.endswith(skip, pos, end if nl == -1 else nl):
                        if (nl == -1 or not startswith(b"data: ", nl + 1)
                                or find(b"\n", nl + 1, end) != -1):
                            break
                        event = _new_event(SSEEvent, (
                            data[pos + 7 : nl].decode().strip(), data[nl + 7 : end].decode(),
                            True, data[pos : end + 2]))
                elif startswith(b"data: ", pos):
                    end = find(b"\n\n", pos)
                    if end == -1 or find(b"\n", pos, end) != -1:
                        break
                    event = _new_event(SSEEvent, (
                        None, data[pos + 6 : end].decode(), True, data[pos : end + 2]))
                else:
                    break
                if end + 2 - pos > max_event:
                    raise SSELimitError(f"SSE event exceeded {max_event} byte limit")
                frames += 1
                if frames > max_frames:
                    raise SSELimitError(f"SSE stream exceeded {max_frames} frame limit")
                if event is not None:
                    events.append(event)
                pos = end + 2
        except UnicodeDecodeError:
            raise ProtocolError("malformed SSE UTF-8") from None
        finally:
            self._frames = frames
        if pos < size:
            self._buf += data[pos:] if pos else data
            events.extend(self._parse_lf())
            if len(self._buf) - self._frame_start > max_event:
                raise SSELimitError(f"SSE event exceeded {max_event} byte limit")
        return events

    def _parse_lf(self) -> list[SSEEvent]:
        """The common case, LF line endings only: whole frames at a time.

        Lines of a frame are only split once the frame is complete, so between
        calls ``_lines`` stays empty and the general parser can take over at
        any frame boundary (a stream may switch line endings).
        """
        buf = self._buf
        pos = self._pos
        events: list[SSEEvent] = []
        size = len(buf)
        while pos < size:
            if buf[pos] == _LF:  # a blank line with nothing before it: an empty frame
                events.append(self._build(bytes(buf[self._frame_start : pos + 1])))
                pos += 1
                self._frame_start = pos
                continue
            end = buf.find(b"\n\n", pos)
            if end == -1:
                break
            skip = self._skip_suffix
            if skip is not None and buf.startswith(b"event: ", pos):
                line_end = buf.find(b"\n", pos, end + 1)
                if buf.endswith(skip, pos, line_end):
                    self._count(end + 2 - self._frame_start)
                    pos = end + 2
                    self._frame_start = pos
                    continue
            raw = bytes(buf[self._frame_start : end + 2])
            event = _one_data_line(raw, pos - self._frame_start)
            if event is None:
                self._lines = bytes(buf[pos:end]).split(b"\n")
                event = self._build(raw)
            else:
                self._count(len(raw))
            events.append(event)
            pos = end + 2
            self._frame_start = pos
        self._pos = pos
        self._compact()
        return events

    def _compact(self) -> None:
        if self._frame_start > 64 * 1024 or (
            self._frame_start and self._frame_start == len(self._buf)
        ):
            del self._buf[: self._frame_start]
            self._pos -= self._frame_start
            self._frame_start = 0

    def _count(self, size: int) -> None:
        """One more frame of ``size`` bytes, within the limits."""
        self._frames += 1
        if size > self._max_event_bytes:
            raise SSELimitError(f"SSE event exceeded {self._max_event_bytes} byte limit")
        if self._frames > self._max_frames:
            raise SSELimitError(f"SSE stream exceeded {self._max_frames} frame limit")
        self._skip = 0

    def _build(self, raw: bytes) -> SSEEvent:
        self._count(len(raw))
        lines, self._lines = self._lines, []
        if len(lines) == 2 and lines[0][:7] == b"event: " and lines[1][:6] == b"data: ":
            # The shape of nearly every provider event, parsed without the general loop.
            return SSEEvent(event=_decode(lines[0][7:]).strip(), data=_decode(lines[1][6:]),
                            has_data=True, raw=raw)
        event: str | None = None
        data: list[str] = []
        for line in lines:
            if line[:1] == b":":
                continue
            name, sep, value = line.partition(b":")
            if sep and value[:1] == b" ":
                value = value[1:]
            if name == b"data":
                data.append(_decode(value))
            elif name == b"event":
                event = _decode(value).strip()
        return SSEEvent(event=event, data="\n".join(data), has_data=bool(data), raw=raw)


# A named tuple built without its generated Python ``__new__`` (which only
# passes its arguments on; skipping it is a tenth of decoding a usual frame):
# ``_new_event(SSEEvent, (event, data, has_data, raw))``.
_new_event = tuple.__new__


def _one_data_line(raw: bytes, start: int) -> SSEEvent | None:
    """The two shapes of nearly every provider frame, ``data: <json>`` and
    ``event: <name>`` + ``data: <json>`` (LF endings, ``raw`` ending in the blank
    line, its content from ``start``), decoded without splitting it into lines;
    None for any other shape (the general parser's)."""
    end = len(raw) - 2
    if raw.startswith(b"data: ", start):
        if raw.find(b"\n", start, end) != -1:
            return None
        return _new_event(SSEEvent, (None, _decode(raw[start + 6 : end]), True, raw))
    if not raw.startswith(b"event: ", start):
        return None
    nl = raw.find(b"\n", start, end)
    if nl == -1 or not raw.startswith(b"data: ", nl + 1) or raw.find(b"\n", nl + 1, end) != -1:
        return None
    return _new_event(SSEEvent, (_decode(raw[start + 7 : nl]).strip(),
                                 _decode(raw[nl + 7 : end]), True, raw))


def _decode(value: bytes) -> str:
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolError("malformed SSE UTF-8") from None


def encode_event(name: str, data: str | bytes) -> bytes:
    """Serialise one event. Always writes ``event:`` (the anthropic SDK drops
    events without it) and always ends with a blank line (Codex drops a last
    event that lacks one)."""
    payload = data.encode("utf-8") if isinstance(data, str) else data
    lines = payload.split(b"\n")
    out = bytearray(b"event: ")
    out += name.encode("utf-8")
    out += b"\n"
    for line in lines:
        out += b"data: "
        out += line
        out += b"\n"
    out += b"\n"
    return bytes(out)


def encode_comment(text: str) -> bytes:
    """An SSE comment frame, e.g. a keepalive. Clients ignore it."""
    return b": " + text.encode("utf-8") + b"\n\n"


def looks_like_sse(prefix: bytes) -> bool:
    """Sniff a body: does it start like an event stream?

    Providers sometimes stream when asked for JSON, and the Codex backend may
    omit the content-type, so the shape of the body decides (lore-spec I.6).
    """
    head = prefix.removeprefix(_BOM).lstrip()
    return head.startswith((b"data:", b"event:", b"id:", b"retry:", b":"))


@dataclass(frozen=True, slots=True)
class Block(Generic[T]):
    """A run of whole frames, each a prefix and one JSON value on one line
    (:func:`frame_block`)."""

    values: list[T]  # each frame's payload, decoded, in order
    size: int  # bytes of the frames, from the start of the data
    frames: int
    chars: int  # characters of the payloads (a round's retained-state measure)


def json_values(payloads: list[bytes], decode: Callable[[bytes], T]) -> list[T] | None:
    """Each payload decoded by ``decode`` (a msgspec decoder of one value), when
    every one is a JSON value on one line; None otherwise.

    One decode a payload, so a payload is exactly one value: two values fail
    as trailing characters, part of one as truncated. The calls run in C
    (``map``), one pass over the bytes. (Their UTF-8 is the caller's to check:
    msgspec does not check the text of what it skips.)"""
    joined = b"\n".join(payloads)
    # A line break or CR in a payload: a value over lines, another field, a comment.
    if joined.count(b"\n") != len(payloads) - 1 or b"\r" in joined:
        return None
    return _decoded(payloads, decode)


def _decoded(payloads: list[bytes], decode: Callable[[bytes], T]) -> list[T] | None:
    try:
        return list(map(decode, payloads))
    except msgspec.DecodeError:
        return None


def frame_block(data: bytes, end: int, prefix: bytes, max_frames: int,
                decode: Callable[[bytes], T]) -> Block[T] | None:
    """For reading a run of frames without a decoder call a frame in Python (a
    live round's text deltas, a stored answer's chunks): the whole frames at the
    start of ``data`` that end before ``end``, decoded by ``decode``, when every
    one of them is ``prefix``, one JSON value on one line and a blank line (LF
    endings, UTF-8), at most ``max_frames`` of them; None otherwise."""
    cut = data.rfind(b"\n\n", 0, end) + 2
    if cut < 2 or not data.startswith(prefix):
        return None
    body = data[len(prefix) : cut - 2]
    payloads = body.split(b"\n\n" + prefix)
    frames = len(payloads)
    # Line breaks only in the separators (the prefix's own included), no CR:
    # json_values' check, on the bytes at hand.
    breaks = (frames - 1) * (prefix.count(b"\n") + 2)
    if frames > max_frames or body.count(b"\n") != breaks or b"\r" in body:
        return None
    values = _decoded(payloads, decode)
    if values is None:
        return None
    chars = text_chars(body)
    if chars is None:
        return None
    return Block(values, cut, frames, chars - (frames - 1) * (len(prefix) + 2))


def text_chars(body: bytes) -> int | None:
    """How many characters ``body`` holds as UTF-8 text (None: it is not UTF-8);
    the fast reads count a run's text this way."""
    if body.isascii():
        return len(body)
    try:
        return len(body.decode())
    except UnicodeDecodeError:
        return None
