"""Reading a session's memory for a compaction answer (synchronous; run on the
writer thread, behind the turns still queued, so the last turn is included).

Read-only, plain SQL in one place. The observations are the union of the
session's first-level logs (archived ones too: a consolidation kept less of them
than the answer has room for, and a model's log says things no rule finds) and
the extractive candidates of its raw messages, read in batches so a long session
is never held whole; the last request and reply; the project's knowledge block.
"""

from __future__ import annotations

import calendar
import re
import time
from collections.abc import Iterator

from lore_gateway.compaction.summary import Dated, SessionMemory
from lore_gateway.distill import extractive
from lore_gateway.distill import format as fmt
from lore_gateway.distill import store as distill_store
from lore_gateway.distill.extractive import SourceMessage
from lore_gateway.knowledge import block as kblock
from lore_gateway.knowledge import store as kstore
from lore_gateway.memory.search.render import is_recall_traffic
from lore_gateway.storage.base import Connection
from lore_gateway.storage.dialect import json_field

# Raw messages read (and turned into candidates) per query.
BATCH_MESSAGES = 400
# The most raw messages a summary reads, newest kept: older ones are represented by
# their logs. Bounds a compaction's work on a session of any length.
MAX_MESSAGES = 20_000
_CODE_BLOCK = re.compile(r"```.*?(?:```|$)", re.S)


def session_memory(conn: Connection, tenant: str, project: str, session: str,
                   knowledge_tokens: int) -> SessionMemory:
    dated: dict[str, tuple[float, int, Dated]] = {}
    for log in conn.execute(
            "SELECT text FROM distillations WHERE tenant = ? AND session = ?"
            " AND generation = 0 AND text != '' ORDER BY id", (tenant, session)).fetchall():
        date, observations = fmt.parse(str(log[0]))
        for obs in observations:
            _add(dated, Dated(date or "Date: unknown", obs))
    messages = chars = 0
    last_request = last_reply = ""
    for batch in _batches(conn, tenant, session):
        messages += len(batch)
        chars += sum(len(m.content) for m in batch)
        date = fmt.date_line(batch[0].created_at)
        for obs in extractive.candidates(batch):
            _add(dated, Dated(date, obs))
        for m in batch:
            if m.role == "user" and extractive.user_text(m.content):
                last_request = extractive.user_text(m.content)
            elif m.role == "assistant" and not m.content.startswith("[tool_call:"):
                last_reply = _CODE_BLOCK.sub(" ", m.content).strip() or last_reply
    ordered = tuple(d for _, _, d in sorted(dated.values(), key=lambda v: (v[0], v[1])))
    entries = kstore.entries(conn, tenant, project)
    knowledge, _ = kblock.render_block(entries, knowledge_tokens)
    return SessionMemory(ordered, messages, chars, last_request, last_reply, knowledge)


def _add(dated: dict[str, tuple[float, int, Dated]], item: Dated) -> None:
    """Keep an observation once (its first sighting), keyed by its text."""
    if item.observation.text not in dated:
        dated[item.observation.text] = (_when(item), len(dated), item)


def _when(item: Dated) -> float:
    """Sort key: the observation's date and clock time (its log's date line)."""
    try:
        day = calendar.timegm(time.strptime(item.date.removeprefix("Date: "), "%b %d, %Y"))
    except ValueError:
        day = 0
    hours, _, minutes = item.observation.time.partition(":")
    return day + int(hours or 0) * 3600 + int(minutes or 0) * 60


def _batches(conn: Connection, tenant: str, session: str) -> Iterator[list[SourceMessage]]:
    first = conn.execute(
        "SELECT coalesce(min(id), 0) FROM (SELECT id FROM messages WHERE tenant = ? AND"
        " session = ? ORDER BY id DESC LIMIT ?) newest", (tenant, session, MAX_MESSAGES)
    ).fetchone()
    after = int(first[0]) - 1 if first else 0
    while True:
        rows = conn.execute(
            "SELECT id, role, content, created_at FROM messages WHERE tenant = ? AND"
            " session = ? AND id > ? AND role != ?"
            f" AND (meta IS NULL OR {json_field(conn, 'meta', 'side_channel')} IS NULL)"
            " ORDER BY id LIMIT ?",
            (tenant, session, after, distill_store.OBSERVATIONS_ROLE, BATCH_MESSAGES)
        ).fetchall()
        if not rows:
            return
        after = int(rows[-1][0])
        # Recall traffic repeats what memory holds; the summary reads the originals.
        batch = [SourceMessage(int(i), str(r), str(c), float(t)) for i, r, c, t in rows
                 if not is_recall_traffic(str(c))]
        if batch:
            yield batch
