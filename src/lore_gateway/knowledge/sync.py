"""``.lore.md`` ↔ the database (synchronous; run on the writer thread).

``import_edits`` applies what a person changed in the file since the gateway
last wrote it; ``export`` rewrites the file (and the pointer section) from the
database. The digest of the last written file is kept in ``kv``, so an
untouched file is never re-imported.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from lore_gateway.knowledge import export as ex
from lore_gateway.knowledge import history, store
from lore_gateway.storage.base import Connection

log = logging.getLogger("lore.knowledge")

MANUAL_SOURCE = ".lore.md"
T = TypeVar("T")


def _kv_key(tenant: str, root: Path) -> str:
    return f"lore_md:{tenant}:{root}"


def _written_digest(conn: Connection, tenant: str, root: Path) -> str | None:
    row = conn.execute("SELECT value FROM kv WHERE key = ?", (_kv_key(tenant, root),)).fetchone()
    return str(row[0]) if row else None


def import_edits(conn: Connection, tenant: str, project: str, root: Path) -> int:
    """Apply a person's edits to ``.lore.md``; how many entries changed.

    A block whose id is known updates that entry; a block without one (or with an
    id from a teammate's database) creates one; a block removed from a file the
    gateway wrote deletes its entry. A file the gateway never wrote (a fresh
    clone) only adds.
    """
    text = ex.read_text(root / ex.FILE_NAME)
    if text is None:
        return 0
    written = _written_digest(conn, tenant, root)
    if written == ex.digest(text):
        return 0
    parsed = ex.parse(text)
    current = {e.id: e for e in store.entries(conn, tenant, project, include_cross=False)}
    changed = 0
    kept: set[str] = set()
    with conn:
        for item in parsed:
            known = current.get(item.id) if item.id else None
            if known is not None:
                kept.add(known.id)
                if (known.category, known.title, known.content.strip()) == (
                        item.category, item.title, item.content.strip()):
                    continue
            try:
                entry, _ = store.upsert(conn, tenant=tenant, project=project,
                                        category=item.category, title=item.title,
                                        content=item.content, confidence=1.0,
                                        source=MANUAL_SOURCE, entry_id=item.id,
                                        actor=history.IMPORT)
            except store.KnowledgeError:
                continue
            kept.add(entry.id)
            changed += 1
        if written is not None:
            for entry_id in set(current) - kept:
                store.delete(conn, tenant, entry_id, actor=history.IMPORT,
                             source=MANUAL_SOURCE)
                changed += 1
    return changed


def export(conn: Connection, tenant: str, project: str, root: Path,
           agents_file: str | None) -> bool:
    """Write ``.lore.md`` (when it changed) and the pointer; True if the file changed."""
    entries = store.entries(conn, tenant, project, include_cross=False)
    path = root / ex.FILE_NAME
    if not entries and not path.exists():
        return False  # a repository the gateway has nothing to say about stays untouched
    text = ex.render(entries)
    changed = ex.read_text(path) != text
    if changed:
        ex.write_atomic(path, text)
    conn.execute("INSERT INTO kv(key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET"
                 " value = excluded.value", (_kv_key(tenant, root), ex.digest(text)))
    if agents_file and entries:
        ex.write_pointer(root, agents_file)
    return changed


def edit(conn: Connection, tenant: str, project: str, root: Path | None,
         change: Callable[[Connection], T]) -> T:
    """Run ``change`` (one transaction) between taking in a person's edits to
    ``.lore.md`` and writing the file again: the file and the database agree
    afterwards, and an edit made in the file is never overwritten. ``root`` is the
    project's work tree, or None when there is no file to keep (not a git work
    tree, or ``LORE_EXPORT`` off). Used by /ui's knowledge page and the MCP
    ``knowledge`` tool; a file that cannot be read or written is logged, not fatal."""
    if root is not None:
        try:
            import_edits(conn, tenant, project, root)
        except OSError as exc:
            log.warning("knowledge: could not read %s: %s", root / ex.FILE_NAME, exc)
    with conn:
        result = change(conn)
    if root is not None:
        try:
            export(conn, tenant, project, root, None)
        except OSError as exc:
            log.warning("knowledge: could not write %s: %s", root / ex.FILE_NAME, exc)
    return result
