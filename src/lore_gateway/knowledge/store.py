"""Knowledge entries in the database (synchronous; writer or reader thread).

An entry belongs to one tenant and one project. ``cross_project`` entries (the
user's own habits) are also shown in the tenant's other projects; project
entries never are. Titles are the identity: a create whose title matches an
existing entry (same words, or mostly the same) updates that entry, so a
contradiction replaces the old content instead of adding a second entry. So does
a create that states another value for a subject an entry states ("the
datastore is SQLite" after "the datastore is Postgres", whatever the titles:
``memory.supersede``): the rule that catches what a curator model (or the fake
one) files under a new title; the old value stays in the entry's history.
Every change made here is kept as a version (``history``), in the same
transaction: this module is the only writer of entries, so none goes unrecorded.
"""

from __future__ import annotations

import re
import time
import uuid
from dataclasses import asdict, dataclass
from typing import Any

from lore_gateway.knowledge import history
from lore_gateway.memory.search.supersede import changed_subject
from lore_gateway.storage.base import Connection

CATEGORIES = ("decision", "pattern", "preference", "architecture", "gotcha")
# Entries kept per project: enough for a large codebase's lasting facts, small
# enough that the curator's view of them and the prompt block stay bounded.
MAX_ENTRIES_PER_PROJECT = 200
MAX_TITLE_CHARS = 120
MAX_CONTENT_CHARS = 1_200
# Two titles are the same entry when this share of the shorter one's words
# appear in the other (and at least two words are shared).
TITLE_OVERLAP = 0.7

_WORD_RE = re.compile(r"[a-z0-9_./-]+")
_STOP = frozenset("a an the of to in on for and or with is are be use uses using".split())


class KnowledgeError(ValueError):
    """A knowledge operation that cannot be applied (the message says why)."""


@dataclass(frozen=True, slots=True)
class Entry:
    id: str
    tenant: str
    project: str
    category: str
    title: str
    content: str
    confidence: float
    source: str
    cross_project: bool
    created_at: float
    updated_at: float

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def state(self) -> history.State:
        return history.State(self.category, self.title, self.content, self.confidence,
                             self.cross_project)


def title_words(title: str) -> frozenset[str]:
    return frozenset(w for w in _WORD_RE.findall(title.lower()) if w not in _STOP)


def same_title(a: str, b: str) -> bool:
    wa, wb = title_words(a), title_words(b)
    if not wa or not wb:
        return a.strip().casefold() == b.strip().casefold()
    shared = len(wa & wb)
    return wa == wb or (shared >= 2 and shared / min(len(wa), len(wb)) >= TITLE_OVERLAP)


def entries(conn: Connection, tenant: str | None, project: str | None, *,
            include_cross: bool = True) -> list[Entry]:
    """A project's entries plus (optionally) the tenant's cross-project ones,
    sorted by category then title. ``project=None`` lists every project."""
    rows = conn.execute(
        "SELECT * FROM knowledge WHERE (?1 IS NULL OR tenant = ?1) AND (?2 IS NULL OR"
        " project = ?2 OR (?3 = 1 AND cross_project = 1)) ORDER BY category, lower(title), id",
        (tenant, project, int(include_cross))).fetchall()
    return [_entry(r) for r in rows]


def get(conn: Connection, tenant: str | None, ref: str) -> Entry:
    """The entry with id ``ref`` (or a unique id prefix of at least 4 characters)."""
    rows = conn.execute(
        "SELECT * FROM knowledge WHERE (?1 IS NULL OR tenant = ?1) AND (id = ?2 OR"
        " (length(?2) >= 4 AND substr(id, 1, length(?2)) = ?2)) LIMIT 3",
        (tenant, ref)).fetchall()
    exact = [r for r in rows if r[0] == ref]
    if exact or len(rows) == 1:
        return _entry((exact or rows)[0])
    if not rows:
        raise KnowledgeError(f"no knowledge entry {ref!r}; see `lore knowledge list`")
    raise KnowledgeError(f"{ref!r} matches several entries; give more of the id")


def version(conn: Connection, tenant: str, project: str) -> tuple[int, float]:
    """Changes to what a session of this project sees (count, newest update)."""
    row = conn.execute(
        "SELECT count(*), coalesce(max(updated_at), 0) FROM knowledge WHERE tenant = ?"
        " AND (project = ? OR cross_project = 1)", (tenant, project)).fetchone()
    return (int(row[0]), float(row[1])) if row else (0, 0.0)


def upsert(conn: Connection, *, tenant: str, project: str, category: str, title: str,
           content: str, confidence: float = 0.8, source: str = "", cross_project: bool = False,
           entry_id: str | None = None, actor: str = history.CURATOR) -> tuple[Entry, bool]:
    """Create an entry, or update the one it duplicates; (entry, created).

    ``actor`` (``history.ACTORS``) is who made the change, for its version. A
    create that lands on another entry by its title (no id, or an id not ours)
    and says something else supersedes that entry's content; an update that
    changes nothing leaves no version."""
    category, title, content = _clean(category, title, content)
    confidence = min(1.0, max(0.0, float(confidence)))
    now = time.time()
    existing = _find(conn, tenant, project, title, content, entry_id, cross_project)
    if existing is not None:
        by_title = existing.id != entry_id
        conn.execute(
            "UPDATE knowledge SET category = ?, title = ?, content = ?, confidence = ?,"
            " source = ?, cross_project = ?, updated_at = ? WHERE id = ?",
            (category, title, content, confidence, source or existing.source,
             int(cross_project), max(now, existing.updated_at + 1e-6), existing.id))
        updated = _entry(conn.execute("SELECT * FROM knowledge WHERE id = ?",
                                      (existing.id,)).fetchone())
        if updated.state() != existing.state():
            change = (history.IMPORTED if actor == history.IMPORT
                      else history.SUPERSEDED if by_title and updated.content != existing.content
                      else history.UPDATED)
            _record(conn, existing, updated, change, actor, source)
        return updated, False
    count = conn.execute("SELECT count(*) FROM knowledge WHERE tenant = ? AND project = ?",
                         (tenant, project)).fetchone()
    if count is not None and int(count[0]) >= MAX_ENTRIES_PER_PROJECT:
        # Evict the least confident, oldest entry: bounded, and a fresh fact wins.
        row = conn.execute("SELECT id FROM knowledge WHERE tenant = ? AND project = ?"
                           " ORDER BY confidence, updated_at LIMIT 1",
                           (tenant, project)).fetchone()
        if row is not None:
            delete(conn, tenant, str(row[0]), actor=actor, source="evicted: the project is full")
    # An id from a file another tenant exported names their entry, not ours.
    taken = entry_id is not None and conn.execute(
        "SELECT 1 FROM knowledge WHERE id = ?", (entry_id,)).fetchone() is not None
    new_id = entry_id if entry_id and not taken else uuid.uuid4().hex
    conn.execute(
        "INSERT INTO knowledge(id, tenant, project, category, title, content, confidence,"
        " source, cross_project, created_at, updated_at) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
        (new_id, tenant, project, category, title, content, confidence, source,
         int(cross_project), now, now))
    created = _entry(conn.execute("SELECT * FROM knowledge WHERE id = ?", (new_id,)).fetchone())
    _record(conn, None, created, history.IMPORTED if actor == history.IMPORT
            else history.CREATED, actor, source)
    return created, True


def delete(conn: Connection, tenant: str | None, entry_id: str, *,
           actor: str = history.CURATOR, source: str = "") -> bool:
    """Delete an entry (its versions stay, with this deletion the newest)."""
    row = conn.execute("SELECT * FROM knowledge WHERE id = ? AND (?2 IS NULL OR tenant = ?2)",
                       (entry_id, tenant)).fetchone()
    if row is None:
        return False
    old = _entry(row)
    conn.execute("DELETE FROM knowledge WHERE id = ?", (old.id,))
    _record(conn, old, None, history.DELETED, actor, source)
    return True


def _record(conn: Connection, before: Entry | None, after: Entry | None, change: str,
            actor: str, source: str) -> None:
    entry = after or before
    assert entry is not None
    history.record(conn, entry_id=entry.id, tenant=entry.tenant, project=entry.project,
                   change=change, actor=actor, source=source,
                   before=before.state() if before else None,
                   after=after.state() if after else None)


def _find(conn: Connection, tenant: str, project: str, title: str, content: str,
          entry_id: str | None, cross_project: bool) -> Entry | None:
    if entry_id:
        row = conn.execute("SELECT * FROM knowledge WHERE id = ? AND tenant = ?",
                           (entry_id, tenant)).fetchone()
        if row is not None:
            return _entry(row)
    rows = conn.execute(
        "SELECT * FROM knowledge WHERE tenant = ? AND (project = ?"
        " OR (? = 1 AND cross_project = 1))",
        (tenant, project, int(cross_project))).fetchall()
    for row in rows:
        if same_title(str(row[4]), title):
            return _entry(row)
    stated = f"{title}\n{content}"
    for row in rows:
        if changed_subject(f"{row[4]}\n{row[5]}", stated) is not None:
            return _entry(row)
    return None


def _clean(category: str, title: str, content: str) -> tuple[str, str, str]:
    category = category.strip().lower()
    if category not in CATEGORIES:
        raise KnowledgeError(f"category must be one of {', '.join(CATEGORIES)}, not "
                             f"{category!r}")
    title = " ".join(title.split())[:MAX_TITLE_CHARS]
    content = content.strip()[:MAX_CONTENT_CHARS]
    if not title or not content:
        raise KnowledgeError("a knowledge entry needs a title and content")
    return category, title, content


def _entry(row: Any) -> Entry:
    (eid, tenant, project, category, title, content, confidence, source, cross, created,
     updated) = row
    return Entry(str(eid), str(tenant), str(project), str(category), str(title), str(content),
                 float(confidence), str(source), bool(cross), float(created), float(updated))
