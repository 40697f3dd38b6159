"""Each hit carries the message before it in its session (``Hit.previous``).

Search ranks a message together with the one before it (``context_fts`` indexes
the pair: an answer rarely repeats the question's words, the question it answers
does), so a hit is often found through its previous message, and what answers
is split between the two: a tool's output and the command that ran it, or an
agent's "THOUGHT: the test still fails on …" and the output it reads. A result
that shows the hit alone shows half of what was ranked. On the natural questions
of ``lore bench coding`` (tuning part, scope session) 30 of the 54 key facts a
top 10 missed were in a message next to one of its hits, and most of those in
the message before it (docs/notes/2026-12-05-issue-33-ranking.md).

The previous message rides along only when the result does not show it already
(as a hit, or as a copy folded into one) and when a result may show it at all
(no recall traffic, no hidden side channel: ``hit_load``). It takes no place
among the hits; the rendered recall shares the hit's room with it (``render``).
"""

from __future__ import annotations

from dataclasses import replace

import orjson

from lore_gateway.memory.search.hits import Hit, Previous, hidden_side_channel, text_key
from lore_gateway.memory.search.render import is_recall_traffic
from lore_gateway.storage.base import Connection

__all__ = ["with_previous"]


def with_previous(conn: Connection, hits: list[Hit]) -> list[Hit]:
    """``hits`` with the message before each in its session (``Hit.previous``);
    the hits are the tenant's already, and each previous shares its hit's tenant."""
    if not hits:
        return hits
    ids = [int(h.ref[2:]) for h in hits]
    marks = ",".join("?" * len(ids))
    # One statement for all of them; each subquery is one step of the
    # (tenant, session, id) index, as in ``search._neighbours``.
    rows = conn.execute(
        "SELECT m.id, p.id, p.role, p.content, p.meta FROM messages m"
        " JOIN messages p ON p.id = (SELECT q.id FROM messages q WHERE q.tenant = m.tenant"
        " AND q.session = m.session AND q.id < m.id ORDER BY q.id DESC LIMIT 1)"
        f" WHERE m.id IN ({marks})", ids).fetchall()
    shown = {ref for h in hits for ref in (h.ref, *h.folded)}
    texts = {text_key(h.content) for h in hits}
    before: dict[int, Previous] = {}
    for mid, prev_id, role, content, meta in rows:
        ref, text = f"t:{int(prev_id)}", str(content)
        if ref in shown or text_key(text) in texts or not text.strip():
            continue
        if is_recall_traffic(text) or hidden_side_channel(orjson.loads(meta) if meta else None):
            continue
        before[int(mid)] = Previous(ref=ref, role=str(role), content=text)
    return [replace(h, previous=before.get(mid)) if mid in before else h
            for h, mid in zip(hits, ids, strict=True)]
