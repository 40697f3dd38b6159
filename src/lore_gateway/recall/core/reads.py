"""The whole frames at the start of an upstream read, for the fast path of a
live recall round (sans-IO).

A Chat or Anthropic answer is mostly text deltas, and a round applies each one
by appending its text and forwarding its bytes. Decoding them one event object
at a time is most of what watching a stream for recall costs, so a round may
take the deltas at the start of a read in one go (``ChatRound.take``,
``AnthropicRound.take``): this module cuts the read into the lines of its whole
frames, of the usual shape only (LF endings, UTF-8, one ``data:`` line, after
one ``event:`` line where the protocol names its events), and stops before any
frame holding one of the round's trigger strings. The round decides frame by
frame how far its fast path goes; the rest of the read is decoded as before.

Deciding frame by frame is itself a Python loop over every delta: most of what
``take`` costs. So a round first tries the run of frames as a whole
(``sse.frame_block``): when every frame is the one line the fast path takes,
each payload is decoded, in C, with types that admit only what the fast path
takes. Any doubt (another shape, another frame, a type the decode refuses)
leaves the round's frame-by-frame path to decide, as before.
"""

from __future__ import annotations

import msgspec


class Frames(msgspec.Struct, frozen=True):
    """The lines of whole frames (the blank separator lines left out), and
    whether they are all ASCII (then a line's length in characters is its
    length in bytes)."""

    lines: list[bytes]
    ascii: bool


def leading_frames(data: bytes, lines_per_frame: int,
                   triggers: tuple[bytes, ...] = (), end: int = -1) -> Frames | None:
    """The whole frames at the start of ``data`` that end before the first of
    ``triggers`` (and before ``end``, when given); None when there are none, or
    they are not all of the usual shape (``lines_per_frame`` lines, the last one
    blank)."""
    if end < 0:
        end = len(data)
    for trigger in triggers:
        found = data.find(trigger, 0, end)
        if found != -1:
            end = found
    cut = data.rfind(b"\n\n", 0, end) + 2
    if cut < 2:
        return None
    body = data[:cut]
    ascii = body.isascii()
    if b"\r" in body or (not ascii and not _utf8(body)):
        return None
    lines = body.split(b"\n")
    lines.pop()  # the empty line after the last separator
    last = lines_per_frame - 1
    if len(lines) % lines_per_frame or any(lines[last::lines_per_frame]):
        return None
    del lines[last::lines_per_frame]
    return Frames(lines, ascii)


def _utf8(data: bytes) -> bool:
    try:
        data.decode()
    except UnicodeDecodeError:
        return False
    return True
