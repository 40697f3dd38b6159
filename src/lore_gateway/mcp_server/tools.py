"""What the MCP tools do: recall, search_sessions, get_message and knowledge.

No MCP SDK here: each method takes the :class:`Caller` (whose memory, and the
project a call means when it names none) and returns the text the agent reads,
or raises :class:`ToolProblem` with one line saying what to do instead.
``server.py`` registers them with the SDK, for ``lore mcp`` (stdio) and the
gateway's ``/mcp`` alike, so both transports answer the same.

``recall`` is the hidden recall tool's own executor (``recall/core/executor.py``):
the same search, limits, rendering and failure texts the model gets through the
gateway. ``knowledge`` writes through ``knowledge/store.py`` and
``knowledge/sync.py`` as ``lore knowledge`` and /ui do, so the project's next
session gets an added entry in its knowledge block and ``.lore.md`` follows.
Every read and write runs inside ``in_tenant`` off the event loop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, TypeVar

from lore_gateway.knowledge import export as ex
from lore_gateway.knowledge import history, store, sync
from lore_gateway.mcp_server import queries
from lore_gateway.memory.data.catalog import DETAIL_DEFAULT_CHARS, StoredMessage, age
from lore_gateway.memory.service import Memory
from lore_gateway.memory.store.records import Identity
from lore_gateway.recall.core.executor import RecallExecutor, SearchGate
from lore_gateway.recall.core.tool import RecallArgumentError, parse_arguments
from lore_gateway.storage.base import Connection, in_tenant

T = TypeVar("T")

RecallScope = Literal["all", "project"]
KnowledgeAction = Literal["list", "add", "edit"]
# search_sessions: a page an agent can read at once, and the most it may ask for.
DEFAULT_SESSIONS = 20
MAX_SESSIONS = 100
# get_message: neighbours on each side, by default and at most; each shown cut to
# a preview (the agent fetches one whole by its reference).
DEFAULT_NEIGHBOURS = 2
MAX_NEIGHBOURS = 10
NEIGHBOUR_PREVIEW_CHARS = 400
# A knowledge entry an agent adds is as sure as one a person types in /ui.
AGENT_CONFIDENCE = 1.0
SOURCE = "mcp"


class ToolProblem(Exception):
    """A call the tool cannot run; the message (one line) says what to do."""


@dataclass(frozen=True, slots=True)
class Caller:
    """Who is asking: the tenant whose memory a call sees, and the project a call
    means when it names none (``lore mcp``: the working directory; ``/mcp``: the
    ``X-Lore-Project`` header; None: every call names its own)."""

    tenant: str
    project: str | None


class MemoryTools:
    def __init__(self, memory: Memory, *, export: bool, gate: SearchGate) -> None:
        self._memory = memory
        # Whether knowledge edits rewrite the project's .lore.md (LORE_EXPORT).
        self._export = export
        # Bounds recall searches in flight and how long one may take.
        self._gate = gate

    # --- recall ------------------------------------------------------------------------

    async def recall(self, caller: Caller, query: str, scope: RecallScope = "all",
                     project: str | None = None) -> str:
        if scope not in ("all", "project"):
            raise ToolProblem(f"scope must be 'all' or 'project', not {scope!r}")
        chosen = project or caller.project
        if scope == "project" and not chosen:
            raise ToolProblem("scope 'project' needs a project: pass project=<the project's "
                              "absolute path> (search_sessions lists them)")
        try:
            args = parse_arguments({"query": query, "scope": scope})
        except RecallArgumentError as exc:
            raise ToolProblem(f"{exc}; pass a short, specific query") from None
        executor = RecallExecutor(self._memory, Identity(caller.tenant, chosen or "", ""),
                                  self._gate)
        return (await executor.run(args)).text

    # --- sessions and messages -----------------------------------------------------------

    async def search_sessions(self, caller: Caller, text: str | None = None,
                              project: str | None = None, limit: int = DEFAULT_SESSIONS) -> str:
        if not 1 <= limit <= MAX_SESSIONS:
            raise ToolProblem(f"limit must be 1-{MAX_SESSIONS}")
        found, more = await self._read(caller.tenant, lambda c: queries.sessions(
            c, caller.tenant, project=project or None, text=text, limit=limit))
        where = "".join([f" of project {project}" if project else "",
                         f" matching {text!r}" if text else ""])
        if not found:
            return (f"No stored sessions{where}. A filter matches a session's first line, "
                    "project or id; use recall to search what was said.")
        now = time.time()
        lines = [f"{len(found)} session{'s' if len(found) != 1 else ''}{where}, newest first"
                 + (f" (more match: raise limit, up to {MAX_SESSIONS}, or narrow the filter)"
                    if more else "") + ":"]
        for s in found:
            lines.append(f"- {s.session} · {s.project} · last active {_when(s.last_seen, now)}"
                         f" · {s.turns} turn{'s' if s.turns != 1 else ''}"
                         + (f" · {s.title}" if s.title else ""))
        return "\n".join(lines)

    async def get_message(self, caller: Caller, ref: str, neighbours: int = DEFAULT_NEIGHBOURS,
                          offset: int = 0) -> str:
        message_id = _message_id(ref)
        if not 0 <= neighbours <= MAX_NEIGHBOURS:
            raise ToolProblem(f"neighbours must be 0-{MAX_NEIGHBOURS}")
        if offset < 0:
            raise ToolProblem("offset must be 0 or more")
        found = await self._read(caller.tenant, lambda c: queries.window(
            c, caller.tenant, message_id, before=neighbours, after=neighbours))
        if found is None:
            raise ToolProblem(f"no stored message {ref.strip()}; references come from recall "
                              "results, e.g. (t:123)")
        return _render_window(found, offset, time.time())

    # --- knowledge ---------------------------------------------------------------------

    async def knowledge(self, caller: Caller, action: KnowledgeAction = "list",
                        project: str | None = None, entry_id: str | None = None,
                        title: str | None = None, content: str | None = None,
                        category: str | None = None,
                        cross_project: bool | None = None) -> str:
        if action == "list":
            return await self._list_knowledge(caller, project or caller.project)
        if action == "add":
            chosen = project or caller.project
            if not chosen:
                raise ToolProblem("add needs a project: pass project=<the project's absolute "
                                  "path>")
            if not title or not content:
                raise ToolProblem("add needs a title and content")
            return await self._save(caller.tenant, chosen, None, category or "decision", title,
                                    content, bool(cross_project))
        if action == "edit":
            if not entry_id:
                raise ToolProblem("edit needs entry_id (knowledge action 'list' shows the ids)")
            old = await self._read(caller.tenant, lambda c: _entry(c, caller.tenant, entry_id))
            return await self._save(
                caller.tenant, old.project, old, category or old.category, title or old.title,
                content or old.content,
                old.cross_project if cross_project is None else cross_project)
        raise ToolProblem(f"action must be list, add or edit, not {action!r}")

    async def _list_knowledge(self, caller: Caller, project: str | None) -> str:
        rows = await self._read(caller.tenant, lambda c: store.entries(c, caller.tenant, project))
        where = f" for project {project}" if project else ""
        if not rows:
            return f"No knowledge entries{where}."
        lines = [f"{len(rows)} knowledge entr{'ies' if len(rows) != 1 else 'y'}{where}:"]
        for e in rows:
            scope = "all projects" if e.cross_project else e.project
            lines.append(f"- [{e.category}] {e.title} (id {e.id}, {scope})\n  "
                         + e.content.replace("\n", "\n  "))
        return "\n".join(lines)

    async def _save(self, tenant: str, project: str, old: store.Entry | None, category: str,
                    title: str, content: str, cross_project: bool) -> str:
        root = ex.work_tree_root(project) if self._export else None

        def change(conn: Connection) -> tuple[store.Entry, bool]:
            return store.upsert(
                conn, tenant=tenant, project=project, category=category, title=title,
                content=content, confidence=old.confidence if old else AGENT_CONFIDENCE,
                source=SOURCE, cross_project=cross_project,
                entry_id=old.id if old else None, actor=history.MCP)

        try:
            entry, created = await asyncio.to_thread(self._memory.write_job, in_tenant(
                tenant, lambda c: sync.edit(c, tenant, project, root, change)))
        except store.KnowledgeError as exc:
            raise ToolProblem(str(exc)) from None
        verb = "added" if created else "updated"
        if old is None and not created:
            verb = "updated (an entry with the same title existed)"
        return (f"{verb} [{entry.category}] {entry.title} (id {entry.id}) for "
                f"{'all projects' if entry.cross_project else entry.project}; the project's "
                "next session gets it in its knowledge block")

    async def _read(self, tenant: str, query: Callable[[Connection], T]) -> T:
        return await asyncio.to_thread(self._memory.read, in_tenant(tenant, query))


def _entry(conn: Connection, tenant: str, entry_id: str) -> store.Entry:
    try:
        return store.get(conn, tenant, entry_id.strip())
    except store.KnowledgeError as exc:
        raise ToolProblem(str(exc).replace("`lore knowledge list`", "knowledge action 'list'")
                          ) from None


def _message_id(ref: str) -> int:
    prefix, _, number = ref.strip().partition(":")
    if prefix != "t" or not number.isdigit():
        raise ToolProblem(f"{ref.strip()!r} is not a message reference; pass one like t:123 "
                          "(recall results carry them)")
    return int(number)


def _when(ts: float, now: float) -> str:
    stamp = time.strftime("%Y-%m-%d %H:%M", time.localtime(ts))
    return f"{stamp} ({age(ts, now)})"


def _render_window(found: queries.MessageWindow, offset: int, now: float) -> str:
    m = found.message
    text = m.content[offset:offset + DETAIL_DEFAULT_CHARS]
    end = offset + len(text)
    lines = [f"## {m.ref} ({m.role}, {_when(m.created_at, now)})",
             f"session {found.session} · project {found.project} · turn {m.turn_id}", "", text]
    if end < len(m.content):
        lines.append(f"\n[Showing characters {offset}–{end} of {len(m.content)}. Call "
                     f"get_message with offset {end} for the rest.]")
    if found.before:
        lines += ["", "### Before", *(_preview(b, now) for b in found.before)]
    if found.after:
        lines += ["", "### After", *(_preview(a, now) for a in found.after)]
    return "\n".join(lines)


def _preview(m: StoredMessage, now: float) -> str:
    flat = " ".join(m.content.split())
    if len(flat) > NEIGHBOUR_PREVIEW_CHARS:
        flat = flat[:NEIGHBOUR_PREVIEW_CHARS - 1] + "…"
    return f"- {m.ref} ({m.role}, {age(m.created_at, now)}): {flat}"
