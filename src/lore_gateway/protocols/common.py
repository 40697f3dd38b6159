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


class ProtocolError(Exception):
    """The upstream or the client broke the wire protocol.

    The message is the exact, user-visible description (lore-spec E.1/E.2 strings).
    """
