"""Knowledge for each session: frozen at its start, updates appended after.

``view`` is what the request pipeline asks before it runs (for the ``knowledge``
slot, after anchor expansion and before the recall tool; ``inject_knowledge``
renders it). The first request of a session imports edits from ``.lore.md``,
renders the block from the project's entries, exports the file again and
persists the block, so a restart gives the same bytes. Later requests reuse
it. When the curator changes the project's entries during the session, the next
request whose newest item is a user message gets one update inserted before
that message, persisted with its position, and every later request carries it
at the same place.

Gateways sharing one database (``LORE_DATABASE_URL``; docs/storage.md, "Several
instances") may each serve any turn of a session, so there the database is the
only truth: each request re-reads the session's row (one key lookup) and takes
the updates another instance appended, a project's version is the newest
``updated_at`` of its entries (a curator on any instance moves it), and an
update is appended only if the row still holds what this instance read.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import orjson

from lore_gateway.config import Settings
from lore_gateway.knowledge import block as kblock
from lore_gateway.knowledge import export as ex
from lore_gateway.knowledge import store, sync
from lore_gateway.knowledge.inject import (
    Delta,
    KnowledgeView,
    update_slot,
)
from lore_gateway.memory.service import Memory
from lore_gateway.memory.store.records import Identity
from lore_gateway.memory.tenancy.fingerprint import has_answer
from lore_gateway.memory.tenancy.identity import UNKNOWN_PROJECT
from lore_gateway.obs import metrics
from lore_gateway.protocols.history import HistoryAdapter, adapter_for
from lore_gateway.routing import Family
from lore_gateway.storage.base import Connection, in_tenant

log = logging.getLogger("lore.knowledge")

# Sessions whose state is kept in memory (the rest reload from the database).
MAX_SESSIONS = 1_024
# Updates appended to one session: each is a permanent part of its prefix.
MAX_UPDATES_PER_SESSION = 4
# Tokens of one update message.
UPDATE_BUDGET_TOKENS = 512


@dataclass(slots=True)
class SessionKnowledge:
    project: str
    block: str
    shown: dict[str, float]  # entry id -> the updated_at the session last saw
    deltas: list[Delta] = field(default_factory=list)
    version: float = 0


def agents_file(family: Family) -> str:
    """Where the pointer to ``.lore.md`` goes: the file the session's agent reads."""
    return adapter_for(family).instructions_file


class KnowledgeService:
    def __init__(self, settings: Settings, memory: Memory) -> None:
        self.settings = settings
        self.memory = memory
        # Another gateway may serve this session's next turn (module docstring).
        self.shared = settings.database_url is not None
        self._sessions: OrderedDict[tuple[str, str], SessionKnowledge] = OrderedDict()
        # Bumped by the curator (same process) when a project's entries change.
        self._versions: dict[tuple[str, str], int] = {}
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}

    def version(self, tenant: str, project: str) -> int:
        """How many times the curator changed this project's entries since start."""
        return self._versions.get((tenant, project), 0)

    def changed(self, tenant: str, project: str) -> None:
        key = (tenant, project)
        self._versions[key] = self._versions.get(key, 0) + 1
        if len(self._versions) > MAX_SESSIONS:
            self._versions.pop(next(iter(self._versions)))

    async def view(self, family: Family, payload: dict[str, Any], identity: Identity, *,
                   coding: bool, keep: bool = True) -> KnowledgeView | None:
        """What this request of the session carries; None for no knowledge.
        ``coding``: the request is a coding agent's turn
        (``knowledge.sidechannel.is_coding_turn``, decided once per request).
        ``keep``: False for a turn memory does not keep (``Exchange.keep``): the
        session's block is read, or rendered and held in this process only; no
        row, no ``.lore.md`` import or export, no update appended.

        A request pipeline of pure transforms computes this before running them
        and hands it to ``inject_knowledge`` through its context.
        """
        if not self.settings.knowledge or identity.project == UNKNOWN_PROJECT or not coding:
            # Without a known project, knowledge would mix unrelated work.
            return None
        history = adapter_for(family)
        try:
            items = payload.get(history.items_key)
            state = await self._state(identity, history, _underway(items), keep)
            if keep:
                await self._maybe_update(history, payload, identity, state)
        except Exception:
            log.exception("knowledge: could not prepare the session's knowledge; the request"
                          " goes on without it")
            return None
        return KnowledgeView(state.block, tuple(state.deltas))

    async def _state(self, identity: Identity, history: HistoryAdapter,
                     underway: bool, keep: bool = True) -> SessionKnowledge:
        key = (identity.tenant, identity.session)
        state = self._sessions.get(key)
        if state is not None:
            self._sessions.move_to_end(key)
            if self.shared:
                await asyncio.to_thread(self._refresh, identity, state)
            return state
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            state = self._sessions.get(key)
            if state is None:
                state = await asyncio.to_thread(self._open, identity, history, underway, keep)
                self._sessions[key] = state
                while len(self._sessions) > MAX_SESSIONS:
                    old, _ = self._sessions.popitem(last=False)
                    self._locks.pop(old, None)
        return state

    def _refresh(self, identity: Identity, state: SessionKnowledge) -> None:
        """Take the updates another instance appended to the session (a thread)."""
        row = self.memory.read(in_tenant(identity.tenant, lambda c: c.execute(
            "SELECT entry_ids, deltas FROM knowledge_sessions WHERE tenant = ? AND"
            " session = ?", (identity.tenant, identity.session)).fetchone()))
        if row is None:
            return
        deltas = [Delta(int(p), str(t)) for p, t in orjson.loads(row[1])]
        if deltas != state.deltas:
            state.deltas = deltas
            state.shown = {str(k): float(v) for k, v in orjson.loads(row[0]).items()}

    def _project_version(self, identity: Identity) -> float:
        """Shared: the newest change to the project's entries, from the database."""
        row = self.memory.read(in_tenant(identity.tenant, lambda c: c.execute(
            "SELECT max(updated_at) FROM knowledge WHERE tenant = ? AND project = ?",
            (identity.tenant, identity.project)).fetchone()))
        return float(row[0]) if row and row[0] is not None else 0.0

    def _open(self, identity: Identity, history: HistoryAdapter, underway: bool,
              keep: bool = True) -> SessionKnowledge:
        """Load the session's persisted block, or start it (runs in a thread;
        ``keep`` False: rendered from the entries as they are, nothing written).

        A session first seen ``underway`` (its history already has answers: the
        gateway was upgraded or its state deleted mid-session) gets no block, which
        would rewrite a cached prefix; its knowledge comes as one update instead.
        """
        tenant, project, session = identity.tenant, identity.project, identity.session
        version: float = (self._project_version(identity) if self.shared
                          else self._versions.get((tenant, project), 0))
        row = self.memory.read(in_tenant(tenant, lambda c: c.execute(
            "SELECT block, entry_ids, deltas FROM knowledge_sessions WHERE tenant = ? AND"
            " session = ?", (tenant, session)).fetchone()))
        if row is not None:
            deltas = [Delta(int(p), str(t)) for p, t in orjson.loads(row[2])]
            seen = orjson.loads(row[1])
            return SessionKnowledge(project, str(row[0]), {str(k): float(v) for k, v in
                                                           seen.items()}, deltas,
                                    version)
        if not keep:
            entries = self.memory.read(in_tenant(tenant, lambda c: store.entries(
                c, tenant, project)))
            text, _ = kblock.render_block(entries, self.settings.knowledge_block_tokens)
            if underway:
                return SessionKnowledge(project, "", {}, [], -1 if entries else version)
            return SessionKnowledge(project, text, {e.id: e.updated_at for e in entries}, [],
                                    version)
        root = ex.work_tree_root(project) if self.settings.export else None

        def start(conn: Connection) -> SessionKnowledge:
            if root is not None:
                try:
                    sync.import_edits(conn, tenant, project, root)
                except OSError as exc:
                    log.warning("knowledge: could not read %s: %s", root / ex.FILE_NAME, exc)
            entries = store.entries(conn, tenant, project)
            text, _ = kblock.render_block(entries, self.settings.knowledge_block_tokens)
            # Entries over the block's budget stay out for the whole session; only
            # entries the curator adds later arrive as updates.
            known = {e.id: e.updated_at for e in entries}
            if underway:
                text, known = "", {}
            if text:
                metrics.record_knowledge("block")
            conn.execute(
                "INSERT INTO knowledge_sessions(tenant, session, project, block,"
                " entry_ids, deltas, created_at) VALUES (?,?,?,?,?,'[]',?)"
                " ON CONFLICT DO NOTHING",
                (tenant, session, project, text, orjson.dumps(known, option=orjson.OPT_SORT_KEYS)
                 .decode(), time.time()))
            if conn.changes() == 0:
                # Another instance started this session first: its block is the one.
                row = conn.execute("SELECT block, entry_ids, deltas FROM knowledge_sessions"
                                   " WHERE tenant = ? AND session = ?",
                                   (tenant, session)).fetchone()
                assert row is not None  # the conflicting row exists: nothing deletes it
                return SessionKnowledge(
                    project, str(row[0]), {str(k): float(v) for k, v in
                                           orjson.loads(row[1]).items()},
                    [Delta(int(p), str(t)) for p, t in orjson.loads(row[2])], version)
            if root is not None:
                try:
                    sync.export(conn, tenant, project, root, history.instructions_file)
                except OSError as exc:
                    log.warning("knowledge: could not write %s: %s", root / ex.FILE_NAME, exc)
            # Underway: a version no curator produced, so this request looks for
            # an update slot at once.
            return SessionKnowledge(project, text, known, [],
                                    -1 if underway and entries else version)

        return self.memory.write_job(in_tenant(tenant, start))

    async def _maybe_update(self, history: HistoryAdapter, payload: dict[str, Any],
                            identity: Identity, state: SessionKnowledge) -> None:
        version: float = (await asyncio.to_thread(self._project_version, identity)
                          if self.shared
                          else self._versions.get((identity.tenant, identity.project), 0))
        if version == state.version or len(state.deltas) >= MAX_UPDATES_PER_SESSION:
            return
        slot = update_slot(history, payload.get(history.items_key))
        if slot is None or any(d.position == slot for d in state.deltas):
            return
        if state.deltas and slot < max(d.position for d in state.deltas):
            return
        state.version = version
        entries = await asyncio.to_thread(self.memory.read, in_tenant(
            identity.tenant, lambda c: store.entries(c, identity.tenant, identity.project)))
        # New entries, and entries changed since the session saw them (a
        # contradiction the curator resolved).
        fresh = [e for e in entries if e.updated_at > state.shown.get(e.id, -1.0)]
        text, ids = kblock.render_update(fresh, UPDATE_BUDGET_TOKENS)
        if not ids:
            return
        old = orjson.dumps([[d.position, d.text] for d in state.deltas]).decode()
        state.deltas.append(Delta(slot, text))
        state.shown.update({e.id: e.updated_at for e in fresh if e.id in ids})
        metrics.record_knowledge("update")
        deltas = orjson.dumps([[d.position, d.text] for d in state.deltas]).decode()
        shown = orjson.dumps(state.shown, option=orjson.OPT_SORT_KEYS).decode()

        def append(conn: Connection) -> bool:
            # Only onto what this instance read: another may have appended meanwhile.
            conn.execute("UPDATE knowledge_sessions SET deltas = ?, entry_ids = ? WHERE"
                         " tenant = ? AND session = ? AND deltas = ?",
                         (deltas, shown, identity.tenant, identity.session, old))
            return bool(conn.changes())

        if not await asyncio.to_thread(self.memory.write_job, in_tenant(identity.tenant, append)):
            await asyncio.to_thread(self._refresh, identity, state)

    def export_now(self, tenant: str, project: str, agents_file: str) -> bool:
        """Rewrite the project's ``.lore.md`` (after the curator); blocks: a thread."""
        if not self.settings.export:
            return False
        root = ex.work_tree_root(project)
        if root is None:
            return False
        return bool(self.memory.write_job(
            lambda c: sync.export(c, tenant, project, root, agents_file)))


def _underway(items: Any) -> bool:
    """Whether the client's history already holds an answer (not the first turn);
    a client's own example exchange and priming replies before its user's first
    message are none (``memory.fingerprint.has_answer``: aider's first request)."""
    return has_answer(items)
