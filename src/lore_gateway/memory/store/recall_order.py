"""Where a turn's hidden recall calls are stored: where the client saw them.

A recall the client never saw left a marker at its place in what the client
got (``recall/core/markers.py``: a status line and the anchor
``<!-- lore-recall:<uuid> -->``): an Anthropic client gets it as a message of
its own between the text before the recall and the answer after it, a Chat
client inside its one message, set off by blank lines. Storage keeps the call
(``[tool_call:recall] {...}``) at that place, so the stored rows read as the
conversation went: the text before the call, the call, the answer that used
it. The markers themselves are removed later, with every other recall trace
(``memory/store/sanitize.py``). Responses stores its anchor items the same way
(``recall/responses/stored.py``).

Pure; it runs where the output is parsed (the storage process for an answer
kept as bytes), and costs nothing for a turn without a recall.
"""

from __future__ import annotations

from collections.abc import Sequence

from lore_gateway.memory.store.records import RecallRow
from lore_gateway.memory.store.sanitize import ANCHOR_RE
from lore_gateway.protocols.common import Message

# What sets a Chat marker off from the answer after it (recall/chat/live.py,
# MARKER_SEPARATOR): not part of the answer.
_SEPARATOR_CHARS = "\n"


def place_recalls(outputs: Sequence[Message], recalls: Sequence[RecallRow]) -> list[Message]:
    """``outputs`` with each recall call at its marker, cutting a message that
    holds a marker in two around it. A call whose marker is not in the outputs
    (none was shown, or the answer could not be read) goes before them all:
    a recall always precedes the answer that used it."""
    if not recalls:
        return list(outputs)
    waiting = {row.anchor: row for row in recalls if row.anchor is not None}
    placed: list[Message] = []
    for message in outputs:
        if not waiting or "lore-recall:" not in message.text:
            placed.append(message)
            continue
        placed.extend(_cut(message, waiting))
    first = [row.message for row in recalls if row.anchor is None or row.anchor in waiting]
    return first + placed


def _cut(message: Message, waiting: dict[str, RecallRow]) -> list[Message]:
    """The message around the markers of waiting recalls, each call after its
    marker (which storage strips, with the blank lines it leaves)."""
    text = message.text
    pieces: list[Message] = []
    cursor = 0
    for match in ANCHOR_RE.finditer(text):
        row = waiting.pop(match.group("uuid"), None)
        if row is None:
            continue
        pieces.append(Message(message.role, _after_marker(text[cursor:match.end()], cursor)))
        pieces.append(row.message)
        cursor = match.end()
    rest = _after_marker(text[cursor:], cursor)
    if rest:
        pieces.append(Message(message.role, rest))
    return pieces


def _after_marker(piece: str, cursor: int) -> str:
    """A piece of the message without the separator a marker before it left."""
    return piece.lstrip(_SEPARATOR_CHARS) if cursor else piece
