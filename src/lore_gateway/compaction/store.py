"""Reading a session's memory for a compaction answer (synchronous; run on the
writer thread, behind the turns still queued, so the last turn is included).

Read-only, plain SQL in one place: the distillations through ``distill.store``,
the messages no distillation covers yet (turned into an extractive log, not
stored), the last raw messages, and the project's knowledge block.
"""

from __future__ import annotations

from lore_gateway.compaction.summary import SessionMemory
from lore_gateway.distill import extractive
from lore_gateway.distill import store as distill_store
from lore_gateway.knowledge import block as kblock
from lore_gateway.knowledge import store as kstore
from lore_gateway.storage.base import Connection
from lore_gateway.storage.dialect import json_field

# The last raw messages shown verbatim (the summary caps their characters too).
RECENT_MESSAGES = 12


def session_memory(conn: Connection, tenant: str, project: str, session: str,
                   knowledge_tokens: int) -> SessionMemory:
    distillations = tuple(d.text for d in distill_store.active(conn, tenant, session)
                          if d.text.strip())
    segment = distill_store.next_segment(conn, tenant, session)
    rows = conn.execute(
        "SELECT role, content FROM messages WHERE tenant = ? AND session = ? AND role != ?"
        f" AND (meta IS NULL OR {json_field(conn, 'meta', 'side_channel')} IS NULL)"
        " ORDER BY id DESC LIMIT ?",
        (tenant, session, distill_store.OBSERVATIONS_ROLE, RECENT_MESSAGES)).fetchall()
    recent = tuple((str(role), str(content)) for role, content in reversed(rows))
    entries = kstore.entries(conn, tenant, project)
    knowledge, _ = kblock.render_block(entries, knowledge_tokens)
    return SessionMemory(distillations, extractive.distill(segment), recent, knowledge)
