"""Every change to a knowledge entry, kept (synchronous; inside the change's transaction).

``store.upsert`` and ``store.delete`` are the only writers of entries, and each
calls ``record`` in the same transaction, so no path (the curator, a person's
edit in ``lore knowledge edit`` or ``/ui``, an import from ``.lore.md``, the MCP
tool) can change an entry without leaving a version. A version holds what
changed (``CHANGES``), who changed it (``ACTORS``), and the entry's state before
and after, so any two versions can be compared even after older ones are pruned.
A deleted entry's versions stay: they are the trail that says where it went.
They go only with what forgets the entry's project or its text
(``distill.store.forget``, ``memory.forget``).
"""

from __future__ import annotations

import difflib
import time
from dataclasses import asdict, dataclass
from typing import Any

from lore_gateway.storage.base import Connection

CREATED, UPDATED, SUPERSEDED, DELETED, IMPORTED = CHANGES = (
    "created", "updated", "superseded", "deleted", "imported")
CURATOR, USER, IMPORT, MCP = ACTORS = ("curator", "user", "import", "mcp")
# Versions kept per entry. The curator rewrites an entry when a session refines
# it (a few times a week on a busy project); 50 versions are months of that and
# at most ~120 KiB per entry (two states of ``MAX_CONTENT_CHARS`` each), so the
# table stays within a few times the entries' own size at ``MAX_ENTRIES_PER_PROJECT``.
MAX_VERSIONS_PER_ENTRY = 50
# Rows ``lore knowledge log`` shows unless told otherwise: a screenful.
DEFAULT_LOG_LIMIT = 50

_COLUMNS = ("entry_id, version, tenant, project, change, actor, source, before_category,"
            " before_title, before_content, before_confidence, before_cross, category,"
            " title, content, confidence, cross_project, created_at")


class HistoryError(ValueError):
    """A history question that has no answer (the message says what to ask instead)."""


@dataclass(frozen=True, slots=True)
class State:
    """What an entry said at one moment."""

    category: str
    title: str
    content: str
    confidence: float
    cross_project: bool


@dataclass(frozen=True, slots=True)
class Version:
    """One change: the entry's state before it (None: it was created) and after it
    (None: it was deleted)."""

    entry_id: str
    version: int
    tenant: str
    project: str
    change: str
    actor: str
    source: str
    before: State | None
    after: State | None
    created_at: float

    @property
    def title(self) -> str:
        state = self.after or self.before
        return state.title if state is not None else ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def record(conn: Connection, *, entry_id: str, tenant: str, project: str, change: str,
           actor: str, source: str, before: State | None, after: State | None) -> int:
    """Keep one version (and prune the entry's oldest beyond the bound); its number."""
    if change not in CHANGES or actor not in ACTORS:
        raise ValueError(f"unknown change {change!r} or actor {actor!r}")
    row = conn.execute("SELECT coalesce(max(version), 0) FROM knowledge_history WHERE"
                       " tenant = ? AND entry_id = ?", (tenant, entry_id)).fetchone()
    number = (int(row[0]) if row else 0) + 1
    b = before or State("", "", "", 0.0, False)
    a = after or State("", "", "", 0.0, False)
    conn.execute(
        f"INSERT INTO knowledge_history({_COLUMNS}) VALUES"
        " (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
        (entry_id, number, tenant, project, change, actor, source,
         *((b.category, b.title, b.content, b.confidence, int(b.cross_project))
           if before is not None else (None,) * 5),
         *((a.category, a.title, a.content, a.confidence, int(a.cross_project))
           if after is not None else (None,) * 5),
         time.time()))
    conn.execute("DELETE FROM knowledge_history WHERE tenant = ? AND entry_id = ? AND"
                 " version <= ?", (tenant, entry_id, number - MAX_VERSIONS_PER_ENTRY))
    return number


def versions(conn: Connection, tenant: str | None, entry_id: str) -> list[Version]:
    """One entry's versions, oldest first."""
    rows = conn.execute(
        f"SELECT {_COLUMNS} FROM knowledge_history WHERE (?1 IS NULL OR tenant = ?1) AND"
        " entry_id = ?2 ORDER BY version", (tenant, entry_id)).fetchall()
    return [_version(r) for r in rows]


def log(conn: Connection, tenant: str | None, project: str | None,
        limit: int = DEFAULT_LOG_LIMIT) -> list[Version]:
    """The newest changes of a tenant's entries (of one project, or every one)."""
    rows = conn.execute(
        f"SELECT {_COLUMNS} FROM knowledge_history WHERE (?1 IS NULL OR tenant = ?1) AND"
        " (?2 IS NULL OR project = ?2) ORDER BY created_at DESC, version DESC LIMIT ?3",
        (tenant, project, limit)).fetchall()
    return [_version(r) for r in rows]


def resolve(conn: Connection, tenant: str | None, ref: str) -> str:
    """The entry id ``ref`` names in the history (the id, or a unique prefix of at
    least 4 characters): a deleted entry has versions but no row of its own."""
    rows = conn.execute(
        "SELECT DISTINCT entry_id FROM knowledge_history WHERE (?1 IS NULL OR tenant = ?1)"
        " AND (entry_id = ?2 OR (length(?2) >= 4 AND substr(entry_id, 1, length(?2)) = ?2))"
        " LIMIT 3", (tenant, ref)).fetchall()
    ids = [str(r[0]) for r in rows]
    if ref in ids or len(ids) == 1:
        return ref if ref in ids else ids[0]
    if not ids:
        raise HistoryError(f"no history for knowledge entry {ref!r} (it has not changed "
                           "since history was kept); see `lore knowledge log`")
    raise HistoryError(f"{ref!r} matches several entries; give more of the id")


def pick(chosen: list[Version], start: int | None, end: int | None
         ) -> tuple[State | None, State | None, Version]:
    """The two states ``diff`` compares: after version ``start`` and after version
    ``end`` (default: the newest); without ``start``, the state before ``end``."""
    if not chosen:
        raise HistoryError("this entry has no versions")
    by_number = {v.version: v for v in chosen}
    known = f"{chosen[0].version}..{chosen[-1].version}"
    for number in (start, end):
        if number is not None and number not in by_number:
            raise HistoryError(f"no version {number} of this entry; it keeps {known}"
                               " (see `lore knowledge log ID`)")
    last = by_number[end] if end is not None else chosen[-1]
    first = by_number[start].after if start is not None else last.before
    return first, last.after, last


def diff(before: State | None, after: State | None, old_label: str, new_label: str) -> str:
    """A unified diff of the content (with the title and category when they changed)."""
    return "".join(difflib.unified_diff(
        _lines(before), _lines(after), fromfile=old_label, tofile=new_label, lineterm="\n"))


def _lines(state: State | None) -> list[str]:
    if state is None:
        return []
    head = [f"# {state.title} [{state.category}]\n", "\n"]
    return head + [line + "\n" for line in state.content.splitlines()]


def forget_project(conn: Connection, tenant: str | None, project: str) -> None:
    """The versions of a project's entries that are gone (``lore data delete``):
    cross-project entries still in the table keep theirs."""
    conn.execute("DELETE FROM knowledge_history WHERE project = ?1 AND (?2 IS NULL OR"
                 " tenant = ?2) AND entry_id NOT IN (SELECT id FROM knowledge)",
                 (project, tenant))


def forget_entry(conn: Connection, tenant: str, entry_id: str) -> None:
    conn.execute("DELETE FROM knowledge_history WHERE tenant = ? AND entry_id = ?",
                 (tenant, entry_id))


def _version(row: Any) -> Version:
    (eid, number, tenant, project, change, actor, source, bcat, btitle, bcontent, bconf,
     bcross, cat, title, content, conf, cross, created) = row
    before = (State(str(bcat), str(btitle), str(bcontent), float(bconf), bool(bcross))
              if bcat is not None else None)
    after = (State(str(cat), str(title), str(content), float(conf), bool(cross))
             if cat is not None else None)
    return Version(str(eid), int(number), str(tenant), str(project), str(change), str(actor),
                   str(source), before, after, float(created))
