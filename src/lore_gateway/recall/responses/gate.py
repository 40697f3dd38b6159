"""Upstream reads of a recall-watched Responses stream that may pass untouched
(sans-IO).

Watching a stream for recall costs a decoded event and an interceptor step per
frame, and most answers never call recall: from ``response.created`` to the
terminal, each of their frames leaves the interceptor byte for byte
(docs/benchmarks.md, "Issue 14"). :class:`UntouchedGate` vouches for a whole
upstream read at once while that holds: a few passes over its bytes and a check
of each frame's JSON that builds only the fields it reads. It keeps what the
interceptor needs to take the stream over later (:class:`Relayed`): the item
events, the numbering, the bytes counted.

It vouches for the complete frames of a read only if the interceptor, in its
transparent state (``LiveInterceptor.transparent``), could have done nothing
but forward them and stay transparent:

* no ``function_call`` in the bytes: a recall, and any call whose name is yet
  unknown, starts with one (text cannot fool the scan, since JSON escapes every
  quote in it; it can only raise a false alarm, which costs a takeover);
* every frame is ``event: <name>``, one ``data:`` line and a blank line, LF
  endings, UTF-8, ``<name>`` one of the events below, the data one JSON object
  whose ``type`` is ``<name>`` and whose ``sequence_number``, when there is one,
  is an integer from the next expected on (the checks the interceptor makes of
  every frame it forwards, so bad input gets the failure it always got);
* lifecycle and terminal events carry a ``response`` object; a terminal ends
  the read and carries its output, one entry per ``output_item.done`` the
  stream had (storage reads the items from it; an output missing or empty, as
  on the Codex backend, is rebuilt from the items, which only the interceptor
  tracks);
* the terminal is at most ``TERMINAL_MAX_BYTES``, and the stream stays within
  the interceptor's limits and the decoder's.

Anything else and the read goes to the interceptor (``pending``), after it has
caught up (``LiveInterceptor.catch_up``). Item events are checked in full only
then: a stream that never needs its items is not held to their bookkeeping.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec
import orjson

from lore_gateway.memory.store.records import RAW_OUTPUT_MAX_BYTES
from lore_gateway.recall.core.reads import leading_frames
from lore_gateway.recall.responses.round import TERMINALS
from lore_gateway.sse import DEFAULT_MAX_EVENT_BYTES, DEFAULT_MAX_FRAMES, SSEEvent

_DELTAS = (
    "response.output_text.delta",
    "response.refusal.delta",
    "response.reasoning_summary_text.delta",
    "response.reasoning_text.delta",
)
_LIFECYCLE = ("response.in_progress", "response.queued")
# The events whose item state the interceptor keeps: applied on takeover.
_ITEMS = (
    "response.output_item.added",
    "response.output_item.done",
    "response.content_part.added",
    "response.content_part.done",
    "response.output_text.done",
    "response.output_text.annotation.added",
    "response.refusal.done",
    "response.reasoning_summary_part.added",
    "response.reasoning_summary_part.done",
    "response.reasoning_summary_text.done",
    "response.reasoning_text.done",
)
_KIND_DELTA, _KIND_LIFECYCLE, _KIND_ITEM, _KIND_TERMINAL = range(4)
# A terminal this size at most goes to storage as its bytes (read where the turn
# is written); the interceptor tracks the items of an answer with a larger one.
TERMINAL_MAX_BYTES = RAW_OUTPUT_MAX_BYTES
# The exact event line of each name the gate knows, and what kind of event it is.
_EVENT_LINES: dict[bytes, tuple[str, int]] = {
    b"event: " + name.encode(): (name, kind)
    for names, kind in ((_DELTAS, _KIND_DELTA), (_LIFECYCLE, _KIND_LIFECYCLE),
                        (_ITEMS, _KIND_ITEM), (TERMINALS, _KIND_TERMINAL))
    for name in names
}


@dataclass(slots=True)
class Relayed:
    """What the gate let through, as the interceptor needs it to take over:
    the item events in order, the next sequence number, the stream's byte count
    and the terminal, once one went out."""

    next_seq: int
    stream_bytes: int
    items_done: int  # output items finished in the stream so far
    items: list[tuple[str, bytes]] = field(default_factory=list)  # name, JSON
    terminal: tuple[SSEEvent, dict[str, Any]] | None = None


class UntouchedGate:
    """Vouches for upstream reads, one after another, while the interceptor sleeps."""

    def __init__(self, *, next_seq: int, stream_bytes: int, budget: int, items_done: int = 0,
                 frames: int = 0, max_frames: int = DEFAULT_MAX_FRAMES,
                 tail: bytes = b"") -> None:
        """``budget``: the stream bytes the gate may let through it, in all;
        ``items_done``: output items the interceptor saw finished before;
        ``frames``: those the stream's decoder already counted, against
        ``max_frames``; ``tail``: the start of a frame the decoder had not finished."""
        self.relayed = Relayed(next_seq, stream_bytes, items_done)
        self._budget = budget
        self._frames = frames
        self._max_frames = max_frames
        self._tail = tail  # an unfinished frame, carried to the next read

    @property
    def frames(self) -> int:
        """Frames counted so far, the decoder's before the gate's included."""
        return self._frames

    @property
    def finished(self) -> bool:
        """A terminal went out: the gate is done, the rest of the body is relayed
        as it comes."""
        return self.relayed.terminal is not None

    def pending(self, data: bytes) -> bytes:
        """What the interceptor must decode after a refused read ``data``."""
        return self._tail + data

    def vouch(self, data: bytes) -> bytes | None:
        """The complete frames of the carried bytes and ``data``, to go to the
        client as they are (possibly none yet), or None: the interceptor must
        see them (nothing was taken from ``data`` then)."""
        buf = self._tail + data if self._tail else data
        cut = buf.rfind(b"\n\n") + 2
        spent = self.relayed.stream_bytes + len(buf)
        if spent > self._budget or len(buf) > DEFAULT_MAX_EVENT_BYTES:
            return None  # (a frame over the decoder's limit on one event fails the stream)
        if cut < 2:
            self._tail = buf
            return b""
        body = buf[:cut]
        if not self._check(body):
            return None
        self._tail = buf[cut:]
        self.relayed.stream_bytes += cut
        return body

    def _check(self, body: bytes) -> bool:
        """Whether the interceptor would forward ``body`` (whole frames) as it is
        and stay transparent; records what it would have kept if so."""
        if b"function_call" in body:
            return False
        frames = leading_frames(body, 3)  # all of ``body``: it ends a frame
        if frames is None:
            return False
        lines = frames.lines  # event line, data line, per frame
        if self._frames + len(lines) // 2 > self._max_frames:
            return False
        if {d[:6] for d in lines[1::2]} != {b"data: "}:
            return False
        datas = [d[6:] for d in lines[1::2]]
        decode = _decode_frame
        try:
            kinds = [_EVENT_LINES[line] for line in lines[0::2]]
            decoded = [decode(d) for d in datas]
        except (KeyError, msgspec.DecodeError):
            return False
        return self._apply(kinds, decoded, lines, datas)

    def _apply(self, kinds: list[tuple[str, int]], frames: list[_Frame], lines: list[bytes],
               datas: list[bytes]) -> bool:
        relayed = self.relayed
        seq = relayed.next_seq
        done = relayed.items_done
        items: list[tuple[str, bytes]] = []
        terminal: tuple[SSEEvent, dict[str, Any]] | None = None
        last = len(kinds) - 1
        for at, ((name, kind), frame) in enumerate(zip(kinds, frames, strict=True)):
            if frame.type != name:
                return False
            number = frame.sequence_number
            if number is not None:
                if not seq <= number < _MAX_SEQUENCE:
                    return False
                seq = number + 1
            if kind == _KIND_DELTA:
                continue
            if kind == _KIND_ITEM:
                if frame.item is not None and frame.item.type == "function_call":
                    return False
                items.append((name, datas[at]))
                done += name == "response.output_item.done"
                continue
            if bytes(frame.response)[:1] != b"{":
                return False  # no response object
            if kind == _KIND_TERMINAL:
                if len(datas[at]) > TERMINAL_MAX_BYTES:
                    return False
                payload = orjson.loads(datas[at])
                output = payload["response"].get("output")
                if at != last or type(output) is not list or len(output) != done or not done:
                    return False
                raw = lines[2 * at] + b"\n" + lines[2 * at + 1] + b"\n\n"
                terminal = (SSEEvent(name, datas[at].decode(), True, raw), payload)
        self._frames += len(kinds)
        relayed.items_done = done
        relayed.next_seq = seq
        relayed.items.extend(items)
        relayed.terminal = terminal
        return True


class _Item(msgspec.Struct):
    type: str = ""


class _Frame(msgspec.Struct):
    """What the gate reads of a frame's JSON: the rest is checked, not built.
    Accepts and refuses what ``orjson.loads`` does, once the bytes are UTF-8
    (msgspec does not check the text of the values it skips)."""

    type: str
    sequence_number: int | None = None
    response: msgspec.Raw = msgspec.Raw(b"")
    item: _Item | None = None  # of output_item events: a call, even spelt with escapes


_decode_frame = msgspec.json.Decoder(_Frame).decode
# orjson reads a larger integer as a float, which the interceptor does not count.
_MAX_SEQUENCE = 2**62
