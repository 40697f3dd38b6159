"""Marker and expand, as the recall service uses it (lore-spec B.6).

Two moments of a request's life touch the anchor store:

* before forwarding, :func:`expand` (the pipeline's ``expand_anchors`` step, on
  the session loaded by :meth:`AnchorReplay.session_for`) puts the exact stored tool-call
  pair back wherever the client's history carries one of our anchors (whether or
  not recall is injected this turn: history must stay byte-stable either way);
* once the client has the whole answer, :meth:`AnchorReplay.commit` stores the
  request's staged recalls. A failed or aborted response never gets here, so
  nothing half-delivered is ever replayed.

Expansion never fails a request: a store or expansion error is logged and the
client's body goes upstream as it came.
"""

from __future__ import annotations

import logging
import re
from typing import Any

import orjson

from lore_gateway.memory.store.anchor_store import (
    AnchorStore,
    RecallStoreFull,
    SessionRecalls,
    StoredRecall,
)
from lore_gateway.memory.store.records import Identity
from lore_gateway.protocols.history import adapter_for
from lore_gateway.recall.anthropic import expand as anthropic_expand
from lore_gateway.recall.anthropic.expand import StoredPair
from lore_gateway.recall.chat import expand as chat_expand
from lore_gateway.recall.core.anchor_context import history_items, prefix_context_id
from lore_gateway.recall.core.chain import StagedRecall
from lore_gateway.recall.gemini import expand as gemini_expand
from lore_gateway.recall.responses import expand as responses_expand
from lore_gateway.routing import Family

log = logging.getLogger("lore.recall")

# What every anchor contains; a body without it has nothing to expand, and the
# check is a byte search, so requests without recalls pay nothing else.
ANCHOR_PROBE = b"lore-recall:"
# The anchor's id, found in the raw body (a serialiser may escape the comment's
# ``<`` and ``>``, never the id).
_ANCHOR_ID = re.compile(rb"lore-recall:([0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}"
                        rb"-[0-9a-f]{12})")


def history_key(family: Family) -> str:
    return adapter_for(family).items_key


class AnchorReplay:
    """Expansion of the client's history and the commit of delivered recalls."""

    def __init__(self, store: AnchorStore) -> None:
        self.store = store

    async def session_for(self, identity: Identity, body: bytes) -> SessionRecalls | None:
        """The session's stored recalls when this body may carry an anchor, else None
        (the one async step of expansion; the rest is the pure :func:`expand`)."""
        if ANCHOR_PROBE not in body:
            return None
        try:
            recalls = await self.store.session(identity.tenant, identity.session,
                                               anchor_ids(body))
        except Exception as exc:  # expansion is an optimisation of history, never a failure
            log.warning("recall anchors not expanded: %s: %s", type(exc).__name__, exc)
            return None
        return recalls if len(recalls) else None

    def commit(self, family: Family, payload: dict[str, Any], identity: Identity | None,
               staged: list[StagedRecall]) -> None:
        """Keep the delivered recalls of one request for the next turns."""
        if identity is None:
            return
        context = prefix_context_id(history_items(payload, history_key(family)))
        entries = [
            StoredRecall.from_messages(
                anchor_id=s.anchor_id, protocol=family, marker=s.marker,
                call_id=s.call.tool_use_id, arguments=s.call.arguments,
                position=s.call.position, context_id=context,
                assistant=s.assistant, tool_result=s.tool_result)
            for s in staged if s.anchor_id is not None
        ]
        try:
            self.store.commit(identity.tenant, identity.session, entries)
        except RecallStoreFull as exc:
            log.warning("recall store: %s; %d recall(s) will not be replayed",
                        exc, len(entries))


def anchor_ids(body: bytes) -> list[str]:
    """The anchor ids a request body carries, in order, once each."""
    return list(dict.fromkeys(m.decode() for m in _ANCHOR_ID.findall(body)))


def expand(family: Family, payload: dict[str, Any],
           recalls: SessionRecalls) -> dict[str, Any]:
    """The payload with our anchors expanded back into their stored pairs (the
    same object when nothing changed). Marks the anchors found as live in the
    session's in-memory use order, so eviction spares them. Never raises."""
    found: list[str] = []

    def lookup(anchor_id: str) -> StoredPair | None:
        entry = recalls.get(anchor_id)
        if entry is None or entry.protocol != family:
            return None
        found.append(anchor_id)
        return entry

    try:
        expanded = _expand(family, payload, lookup)
    except Exception as exc:  # expansion is an optimisation of history, never a failure
        log.warning("recall anchors not expanded: %s: %s", type(exc).__name__, exc)
        return payload
    recalls.touch(found)
    return payload if expanded is None else expanded


def expanded_length(family: Family, before: dict[str, Any], after: dict[str, Any],
                    body_len: int) -> int:
    """The length of ``after`` (``before`` with anchors expanded) serialised, from
    the client body's ``body_len``: only the history items expansion replaced
    are measured (the recall pairs), never the whole payload. This is what the
    context planner sizes a request by, since the pairs go upstream too."""
    if after is before:
        return body_len
    key = history_key(family)
    old, new = before.get(key), after.get(key)
    if not isinstance(old, list) or not isinstance(new, list):
        return body_len
    kept = {id(item) for item in old} & {id(item) for item in new}
    added = sum(len(orjson.dumps(item)) + 1 for item in new if id(item) not in kept)
    removed = sum(len(orjson.dumps(item)) + 1 for item in old if id(item) not in kept)
    return body_len + added - removed


def _expand(family: Family, payload: dict[str, Any],
            lookup: responses_expand.Lookup) -> dict[str, Any] | None:
    if family == Family.RESPONSES:
        return responses_expand.expand_input(payload, lookup)
    if family == Family.GEMINI:
        contents = payload.get("contents")
        if not isinstance(contents, list):
            return None
        expanded = gemini_expand.expand_contents(contents, lookup)
        return None if expanded is None else {**payload, "contents": expanded}
    messages = payload.get("messages")
    if not isinstance(messages, list):
        return None
    module = anthropic_expand if family == Family.ANTHROPIC else chat_expand
    expanded = module.expand_messages(messages, lookup)
    return None if expanded is None else {**payload, "messages": expanded}
