"""Types shared by the protocol models and the memory store."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Role = Literal["user", "assistant", "tool", "system"]


@dataclass(frozen=True, slots=True)
class Message:
    """One message of a turn, flattened to text for storage and search.

    Tool calls are rendered as ``[tool_call:<name>] <arguments>`` and tool results
    as ``[tool:<name or call id>] <output>``; reasoning summaries as
    ``[reasoning] <text>``. Multi-part content is joined with ``"\\n"``.
    """

    role: Role
    text: str


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One tool call the model made. ``arguments`` is the raw JSON string the
    model wrote (Responses custom tools: their free-form input; Anthropic: the
    parsed input re-serialised)."""

    call_id: str
    name: str
    arguments: str
    item_id: str = ""


def content_text(content: object) -> str:
    """Text of a message's content in any of the three protocols: a string, or
    the ``text`` of its parts/blocks joined by newlines (other parts ignored)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    return "\n".join(
        p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
    )


class ProtocolError(Exception):
    """The upstream or the client broke the wire protocol.

    The message is the exact, user-visible description (lore-spec E.1/E.2 strings).
    """


class TextBuffer:
    """Text that arrives in pieces (stream deltas).

    ``text = text + delta`` copies the whole text at every delta: quadratic, and
    seconds of event-loop time for a multi-megabyte answer. Pieces are kept in a
    list and joined once when read. With ``limit``, only the first ``limit``
    characters are kept and the rest is counted in ``dropped``: storage keeps a
    bounded amount of a huge answer while the relay forwards all of it.
    """

    __slots__ = ("_joined", "_parts", "_size", "dropped", "limit")

    def __init__(self, initial: str = "", limit: int | None = None) -> None:
        self.limit = limit
        self._parts: list[str] = []
        self._size = 0
        self._joined: str | None = None
        self.dropped = 0
        if initial:
            self.append(initial)

    def append(self, piece: str) -> None:
        if self.limit is not None:
            room = self.limit - self._size
            if room < len(piece):
                self.dropped += len(piece) - max(room, 0)
                piece = piece[: max(room, 0)]
        if piece:
            self._parts.append(piece)
            self._size += len(piece)
            self._joined = None

    @property
    def value(self) -> str:
        if self._joined is None:
            self._joined = "".join(self._parts)
            self._parts = [self._joined] if self._joined else []
        return self._joined
