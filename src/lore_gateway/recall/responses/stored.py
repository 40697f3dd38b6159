"""A Responses turn as storage keeps it: written once for the gateway, which
stores the items the interceptor tracked, and for ``lore-store``, which reads
them from an untouched stream's terminal (``memory.answer_scan``)."""

from __future__ import annotations

from typing import Any

from lore_gateway.protocols.common import Message
from lore_gateway.protocols.responses import items_messages
from lore_gateway.recall.core.markers import parse_anchor


def turn_messages(items: list[dict[str, Any]],
                  calls: dict[str, dict[str, Any]] | None = None) -> list[Message]:
    """A Responses turn for storage: the model's items, recall calls included.

    An anchor item (what the client got in place of a recall) is stored as the
    recall call it stands for, from ``calls`` (anchor id → ``function_call``), never
    as its text. Recall *results* are left out: they are copies of stored memory,
    and storing them again would make every later search find its own echo.
    """
    kept: list[dict[str, Any]] = []
    for item in items:
        if item.get("type") == "function_call_output":
            continue
        anchor = _anchor_of(item)
        if anchor is None:
            kept.append(item)
        elif calls and anchor in calls:
            kept.append(calls[anchor])
    return items_messages(kept)


def _anchor_of(item: dict[str, Any]) -> str | None:
    """The anchor id of a message item that only carries a recall anchor."""
    content = item.get("content") if item.get("type") == "message" else None
    if isinstance(content, list) and len(content) == 1 and isinstance(content[0], dict):
        return parse_anchor(str(content[0].get("text") or ""))
    return None
