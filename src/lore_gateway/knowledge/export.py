"""``.lore.md`` at the root of the project's git work tree, and a pointer to it.

The file is meant to be committed and merged: categories and entries are
sorted, each entry is one block preceded by a hidden ``<!-- lore:<id> -->``
comment, with a blank line between blocks, so two people's additions merge
without conflicts. A person may edit it; ``parse`` reads it back and the next
session imports the changes. AGENTS.md (Codex) or CLAUDE.md (Claude Code) get
only a short section between two markers; everything outside them is kept.
Rendering and parsing are pure; ``write_*`` do the file IO.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from lore_gateway.knowledge.store import CATEGORIES, Entry

FILE_NAME = ".lore.md"
HEADER = ("<!-- Maintained by lore-gateway from your coding sessions. Edit freely: changes are "
          "imported at the next session. Keep each entry's lore:id comment. -->")
TITLE = "# Project knowledge"
POINTER_BEGIN = "<!-- lore-gateway:begin (managed section; edits inside are replaced) -->"
POINTER_END = "<!-- lore-gateway:end -->"
POINTER_BODY = (
    "## Project knowledge\n\n"
    "Decisions, patterns, preferences and gotchas learned in earlier sessions are kept in "
    "[`.lore.md`](.lore.md). Read it before changing the code, correct it when it is wrong, "
    "and commit it with your changes.")
# A file larger than this is not ours to parse (someone replaced it).
MAX_FILE_BYTES = 1024 * 1024

_ID_RE = re.compile(r"^<!--\s*lore:([0-9a-fA-F-]{8,64})\s*-->$")
_ENTRY_RE = re.compile(r"^\* \*\*(.+?)\*\*:\s*(.*)$")
_CATEGORY_RE = re.compile(r"^##\s+(\w+)\s*$")


@dataclass(frozen=True, slots=True)
class FileEntry:
    """An entry as a person left it in ``.lore.md`` (``id`` None: a new one)."""

    id: str | None
    category: str
    title: str
    content: str


def work_tree_root(project: str) -> Path | None:
    """The git work tree holding ``project`` (a local directory), or None."""
    try:
        path = Path(project)
        if not path.is_absolute() or not path.is_dir():
            return None
        for candidate in (path, *path.parents):
            if (candidate / ".git").exists():
                return candidate
    except OSError:
        return None
    return None


def render(entries: list[Entry]) -> str:
    """The whole file for a project's own entries (cross-project ones stay out)."""
    lines = [HEADER, "", TITLE]
    for category in sorted(CATEGORIES):
        chosen = sorted((e for e in entries if e.category == category and not e.cross_project),
                        key=lambda e: (e.title.casefold(), e.id))
        if not chosen:
            continue
        lines += ["", f"## {category.capitalize()}"]
        for entry in chosen:
            content = "\n  ".join(entry.content.strip().splitlines())
            lines += ["", f"<!-- lore:{entry.id} -->", f"* **{entry.title}**: {content}"]
    return "\n".join(lines) + "\n"


def parse(text: str) -> list[FileEntry]:
    """Entries of a ``.lore.md``; unknown lines are ignored."""
    found: list[FileEntry] = []
    category: str | None = None
    pending_id: str | None = None
    current: list[str] | None = None
    head: tuple[str | None, str, str] | None = None

    def close() -> None:
        nonlocal current, head
        if head is not None and current is not None:
            content = "\n".join(current).strip()
            if content:
                found.append(FileEntry(head[0], head[1], head[2], content))
        current, head = None, None

    for raw in text.splitlines():
        line = raw.rstrip()
        stripped = line.strip()
        cat = _CATEGORY_RE.match(stripped)
        ident = _ID_RE.match(stripped)
        entry = _ENTRY_RE.match(stripped)
        if cat:
            close()
            name = cat.group(1).lower()
            category = name if name in CATEGORIES else None
        elif ident:
            close()
            pending_id = ident.group(1).lower()
        elif entry and category is not None:
            close()
            head = (pending_id, category, entry.group(1).strip())
            current = [entry.group(2)]
            pending_id = None
        elif current is not None and stripped:
            current.append(stripped)
        elif not stripped:
            close()
    close()
    return found


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def with_pointer(existing: str) -> str:
    """``existing`` with the managed section replaced, or appended once."""
    section = f"{POINTER_BEGIN}\n{POINTER_BODY}\n{POINTER_END}"
    start = existing.find(POINTER_BEGIN)
    end = existing.find(POINTER_END, start + 1) if start >= 0 else -1
    if start >= 0 and end >= 0:
        return existing[:start] + section + existing[end + len(POINTER_END):]
    if not existing.strip():
        return section + "\n"
    return existing.rstrip("\n") + "\n\n" + section + "\n"


def write_atomic(path: Path, text: str) -> None:
    """Replace ``path`` whole (a reader never sees half a file)."""
    fd, tmp = tempfile.mkstemp(prefix=".lore-", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        if path.exists():
            os.chmod(tmp, path.stat().st_mode & 0o777)
        else:
            os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with_suppress_unlink(tmp)
        raise


def with_suppress_unlink(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def read_text(path: Path) -> str | None:
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            return None
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def write_pointer(root: Path, agents_file: str) -> None:
    path = root / agents_file
    existing = read_text(path) if path.exists() else ""
    if existing is None:
        return
    updated = with_pointer(existing)
    if updated != existing:
        write_atomic(path, updated)
