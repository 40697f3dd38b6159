"""The knowledge page: entries per project, edited the way ``lore knowledge edit`` does;
an entry's page shows its history, each change with its diff.

A save or delete runs as one job on the memory writer: first the person's own
edits to the project's ``.lore.md`` are taken in (so the page never overwrites
them), then the change, then the file is written again from the database. The
file and the database therefore agree after every click.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlencode

from lore_gateway.config import Settings
from lore_gateway.knowledge import export as ex
from lore_gateway.knowledge import history, store, sync
from lore_gateway.storage.base import Connection

if TYPE_CHECKING:
    from lore_gateway.memory.service import Memory

T = TypeVar("T")

UI_SOURCE = "lore ui"
MAX_VERSIONS = history.MAX_VERSIONS_PER_ENTRY


def categories() -> tuple[str, ...]:
    return store.CATEGORIES


def listing(conn: Connection, tenant: str, project: str | None) -> dict[str, Any]:
    """Entries grouped by project, and every project that has any (for the filter)."""
    rows = store.entries(conn, tenant, project, include_cross=project is not None)
    grouped: dict[str, list[store.Entry]] = {}
    for entry in rows:
        grouped.setdefault(entry.project, []).append(entry)
    known = [str(r[0]) for r in conn.execute(
        "SELECT DISTINCT project FROM knowledge WHERE tenant = ? ORDER BY project", (tenant,))]
    return {"groups": grouped, "projects": known,
            "files": {p: _file_of(p) for p in grouped}}


def _file_of(project: str) -> str:
    root = ex.work_tree_root(project)
    return str(root / ex.FILE_NAME) if root is not None else ""


def entry(conn: Connection, tenant: str, entry_id: str) -> store.Entry | None:
    try:
        return store.get(conn, tenant, entry_id)
    except store.KnowledgeError:
        return None


def changes(conn: Connection, tenant: str, entry_id: str) -> list[dict[str, Any]]:
    """The entry's versions, newest first, each with the diff of its change as
    lines the page colours (``add``, ``del``, ``hunk``, ``ctx``)."""
    shown = []
    for version in reversed(history.versions(conn, tenant, entry_id)):
        text = history.diff(version.before, version.after, f"before v{version.version}",
                            f"v{version.version}")
        lines = [(_kind(line), line) for line in text.splitlines()[2:]]  # no file names
        shown.append({"version": version, "lines": lines})
    return shown


def _kind(line: str) -> str:
    return {"+": "add", "-": "del", "@": "hunk"}.get(line[:1], "ctx")


def _sync_around(conn: Connection, settings: Settings, tenant: str, project: str,
                 change: Callable[[Connection], T]) -> T:
    root = ex.work_tree_root(project) if settings.export else None
    return sync.edit(conn, tenant, project, root, change)


def save(memory: Memory, settings: Settings, tenant: str, form: dict[str, str]) -> str:
    """Create or update an entry from the edit form; where to go next. Blocking."""
    entry_id = form.get("id", "").strip()
    old = memory.read(lambda c: entry(c, tenant, entry_id)) if entry_id else None
    project = old.project if old is not None else form.get("project", "").strip()
    if not project:
        return "/ui/knowledge/edit?" + urlencode({"problem": "a project is needed"})

    def change(conn: Connection) -> store.Entry:
        saved, _ = store.upsert(
            conn, tenant=tenant, project=project,
            category=form.get("category", old.category if old else "decision"),
            title=form.get("title", ""), content=form.get("content", ""),
            confidence=old.confidence if old else 1.0, source=UI_SOURCE,
            cross_project=form.get("cross_project") == "on",
            entry_id=old.id if old else None, actor=history.USER)
        return saved

    try:
        saved = memory.write_job(lambda c: _sync_around(c, settings, tenant, project, change))
    except store.KnowledgeError as exc:
        query = {"id": entry_id, "project": project, "problem": str(exc)}
        return "/ui/knowledge/edit?" + urlencode({k: v for k, v in query.items() if v})
    return "/ui/knowledge?" + urlencode({"project": saved.project, "saved": saved.id})


def delete(memory: Memory, settings: Settings, tenant: str, entry_id: str) -> str:
    old = memory.read(lambda c: entry(c, tenant, entry_id))
    if old is None:
        return "/ui/knowledge"
    memory.write_job(lambda c: _sync_around(
        c, settings, tenant, old.project, lambda conn: store.delete(
            conn, tenant, old.id, actor=history.USER, source=UI_SOURCE)))
    return "/ui/knowledge?" + urlencode({"project": old.project})
