"""The curator: observation logs → knowledge operations (prompt and parsing).

The worker model gets the project's current entries and the new logs, and
answers with JSON operations. ``parse_ops`` accepts only well-formed ones;
``apply_ops`` runs them through the store, where a create that duplicates an
existing title becomes an update.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import orjson

from lore_gateway.knowledge import store
from lore_gateway.knowledge.store import CATEGORIES, Entry, KnowledgeError
from lore_gateway.storage.base import Connection

# Output tokens for one curator answer: a few dozen entries at most.
CURATOR_MAX_TOKENS = 2_048
# Existing entries shown to the curator, so its input stays bounded however
# many a project holds.
MAX_ENTRIES_SHOWN = 120
MAX_LOG_CHARS = 24_000

CURATOR_SYSTEM = """\
You maintain the long-term knowledge of one software project: the few facts a \
developer joining tomorrow would need. You get the current entries and new session \
logs. Answer with JSON only, in the form
{"ops": [{"op": "create" | "update" | "delete", "id": "<id, for update and delete>", \
"category": "decision" | "pattern" | "preference" | "architecture" | "gotcha", \
"title": "...", "content": "...", "confidence": 0.6-1.0, "cross_project": false}]}

Keep only durable, project-specific knowledge:
- decision: what was decided, the alternative rejected, and why;
- pattern: how things are done in this codebase;
- preference: how the user wants work done (their own words carry the most weight);
- architecture: components, where things live, how they connect;
- gotcha: a trap, why the wrong way looks right, and the fix.
Leave out task status, one-off details, and anything the code plainly says.
Titles are 2 to 6 specific words naming the file, symbol, tool or topic. When a new \
fact contradicts or refines an entry, update that entry by its id; never add a second \
entry on the same topic. Set cross_project true only for the user's personal habits \
that hold in every repository. An empty {"ops": []} is a good answer when nothing new \
is lasting."""


@dataclass(frozen=True, slots=True)
class Op:
    op: str
    id: str | None
    category: str
    title: str
    content: str
    confidence: float
    cross_project: bool


def curator_prompt(entries: list[Entry], logs: list[str]) -> tuple[str, str]:
    shown = entries[:MAX_ENTRIES_SHOWN]
    current = [{"id": e.id, "category": e.category, "title": e.title, "content": e.content}
               for e in shown]
    text = "\n\n".join(logs)
    if len(text) > MAX_LOG_CHARS:
        text = text[-MAX_LOG_CHARS:]
    user = ("Current entries:\n" + orjson.dumps(current).decode()
            + "\n\nNew session logs:\n" + text)
    return CURATOR_SYSTEM, user


def parse_ops(text: str) -> list[Op]:
    """The operations in a curator answer; raises ``ValueError`` when none parse."""
    match = re.search(r"\{.*\}", text, re.S)
    if match is None:
        raise ValueError("the curator answer holds no JSON object")
    payload = orjson.loads(match.group(0))
    raw = payload.get("ops") if isinstance(payload, dict) else None
    if not isinstance(raw, list):
        raise ValueError("the curator answer has no \"ops\" list")
    ops: list[Op] = []
    for item in raw:
        if not isinstance(item, dict) or item.get("op") not in ("create", "update", "delete"):
            continue
        category = str(item.get("category") or "").lower()
        if item["op"] != "delete" and category not in CATEGORIES:
            continue
        ops.append(Op(str(item["op"]), str(item["id"]) if item.get("id") else None, category,
                      str(item.get("title") or ""), str(item.get("content") or ""),
                      _confidence(item.get("confidence")), item.get("cross_project") is True))
    return ops


def apply_ops(conn: Connection, tenant: str, project: str, ops: list[Op],
              source: str) -> int:
    """Apply the operations in one transaction; how many changed an entry."""
    changed = 0
    with conn:
        for op in ops:
            if op.op == "delete":
                if op.id and _owned(conn, tenant, project, op.id):
                    changed += int(store.delete(conn, tenant, op.id))
                continue
            entry_id = op.id if op.op == "update" and op.id and _owned(
                conn, tenant, project, op.id) else None
            try:
                store.upsert(conn, tenant=tenant, project=project, category=op.category,
                             title=op.title, content=op.content, confidence=op.confidence,
                             source=source, cross_project=op.cross_project, entry_id=entry_id)
            except KnowledgeError:
                continue
            changed += 1
    return changed


def _owned(conn: Connection, tenant: str, project: str, entry_id: str) -> bool:
    """An operation may only touch this project's entries (or the tenant's shared ones)."""
    row = conn.execute("SELECT 1 FROM knowledge WHERE id = ? AND tenant = ? AND (project = ?"
                       " OR cross_project = 1)", (entry_id, tenant, project)).fetchone()
    return row is not None


def _confidence(value: Any) -> float:
    try:
        return min(1.0, max(0.0, float(value)))
    except (TypeError, ValueError):
        return 0.8
