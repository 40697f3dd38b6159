"""One history adapter per protocol family, behind one interface (pure).

Context management, knowledge and compaction rewrite or read the client's
conversation without knowing its wire format: each asks the adapter of the
request's family, taken once at its entry point (``adapter_for``). Everything a
feature needs to know about a protocol's history is here: where the items are,
which lead, what a user turn, a tool output or an instruction looks like, how a
message is written, where system text goes, its thinking and prompt-cache rules
(Anthropic's ``cache_control`` breakpoints and their TTLs), the compaction
requests it carries and the shape of the usage it reports.

Adding a protocol is one new ``history_<protocol>`` module and its line in
``ADAPTERS``. Every method takes plain dicts and returns new objects; none
mutates its input.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from lore_gateway.compaction.detect import Flow
from lore_gateway.protocols.history_anthropic import ANTHROPIC
from lore_gateway.protocols.history_chat import CHAT
from lore_gateway.protocols.history_common import Item
from lore_gateway.protocols.history_gemini import GEMINI
from lore_gateway.protocols.history_responses import RESPONSES
from lore_gateway.routing import Family


class UsageScaler(Protocol):
    """Scales the usage objects of one response (one per response: Anthropic's
    factor, chosen at ``message_start``, holds until its ``message_delta``)."""

    def scale(self, usage: dict[str, Any], factor: Callable[[int], float | None],
              event: object) -> bool:
        """Scale ``usage`` in place by ``factor(total)`` (None: leave it);
        ``event`` is the ``type`` of the frame holding it. True if it changed."""
        ...


class HistoryAdapter(Protocol):
    """A protocol's conversation history as the features see it."""

    @property
    def family(self) -> Family: ...

    @property
    def items_key(self) -> str:
        """The payload key of the history list (``messages``, ``input``)."""
        ...

    @property
    def instructions_file(self) -> str:
        """The file the protocol's agent reads its project instructions from."""
        ...

    def lead_count(self, items: list[Any]) -> int:
        """Leading instruction items, which stay in place when history is cut."""
        ...

    def is_user_text(self, item: Any) -> bool:
        """A user message that is not a tool result: a real turn start."""
        ...

    def is_tool_output(self, item: Any) -> bool: ...

    def is_assistant_side(self, item: Item) -> bool:
        """The model's own item (a message, a tool call, reasoning)."""
        ...

    def is_system(self, item: Any) -> bool:
        """An instruction message inside the history."""
        ...

    def user_text(self, item: Any) -> str:
        """The text of a user message (empty for anything else)."""
        ...

    def thinking_mode(self, payload: Mapping[str, Any]) -> str | None:
        """Extended thinking's type (``enabled``, ``adaptive``), or None."""
        ...

    def shrink_output(self, item: Item, shrink: Callable[[str], str | None]) -> Item:
        """A tool-output item with each output text replaced by ``shrink(text)``
        (None: kept); the item itself when nothing changed."""
        ...

    def without_tool_results(self, item: Item) -> Item | None:
        """A tool-output item with its results removed, or None when nothing
        else is left (the whole item goes)."""
        ...

    def user_message(self, text: str, cache_control: Item | None = None) -> Item:
        """A user message of ``text`` (with ``cache_control`` on its block,
        where the protocol has breakpoints)."""
        ...

    def assistant_message(self, text: str) -> Item: ...

    def update_items(self, text: str, ack: str) -> list[Item]:
        """Items that tell the model ``text`` mid-conversation, keeping role
        order valid on both sides (``ack``: the assistant's reply, if one is needed)."""
        ...

    def add_system_text(self, payload: dict[str, Any], text: str) -> dict[str, Any]:
        """``payload`` with ``text`` at the end of its system instructions."""
        ...

    def cache_ttl(self, payload: Mapping[str, Any]) -> float:
        """Seconds a cached prefix of this request stays warm without traffic."""
        ...

    def cache_marker(self, payload: Mapping[str, Any], tail: list[Any]) -> Item | None:
        """The breakpoint a prefix placed before ``tail`` carries (None: the
        protocol caches without markers)."""
        ...

    def fit_breakpoints(self, payload: Mapping[str, Any], items: list[Any],
                        start: int) -> list[Any]:
        """``items`` within the protocol's breakpoint limit, dropping the oldest
        markers from ``start`` on."""
        ...

    def compaction_flow(self, payload: Mapping[str, Any],
                        headers: Mapping[str, str]) -> Flow | None:
        """The agent compaction request this is, in this protocol's shapes."""
        ...

    def usage_scaler(self) -> UsageScaler:
        """A fresh scaler for the usage of one response."""
        ...


ADAPTERS: dict[Family, HistoryAdapter] = {
    Family.RESPONSES: RESPONSES,
    Family.ANTHROPIC: ANTHROPIC,
    Family.CHAT: CHAT,
    Family.GEMINI: GEMINI,
}


def adapter_for(family: Family) -> HistoryAdapter:
    return ADAPTERS[family]
