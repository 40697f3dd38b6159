"""Context management for each session: the asyncio shell around the planner.

Before the request pipeline runs, ``prepare`` loads the session's state (a
bounded in-process cache in front of ``context_sessions``), asks the pure
planner what the upstream history is, loads the distillations only when a
rewrite is due, and returns the state the pipeline's ``context`` slot renders.
After the response, ``observe`` calibrates the session's token estimate from the
usage the upstream reported; ``overflow`` forces a higher layer after a
context-length error. State writes are jobs on the memory writer thread, never
on the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from lore_gateway.config import Settings
from lore_gateway.context import planner
from lore_gateway.context import store as cstore
from lore_gateway.context.planner import Limits, SessionState
from lore_gateway.context.windows import window_for
from lore_gateway.memory.service import Memory
from lore_gateway.memory.store.records import Identity
from lore_gateway.obs import metrics
from lore_gateway.protocols.history import adapter_for
from lore_gateway.routing import Family
from lore_gateway.storage.base import in_tenant

log = logging.getLogger("lore.context")

# Sessions whose state stays in memory (the rest reload from the database on
# their next request); a state is a few KB (the frozen prefix dominates).
MAX_SESSIONS = 1_024
# Calibration-only changes are persisted every this many usage reports (layout
# changes at once): the ratio moves slowly, the writer need not see each one.
PERSIST_EVERY = 8


class ContextService:
    def __init__(self, settings: Settings, memory: Memory,
                 clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.memory = memory
        self.clock = clock
        self._states: OrderedDict[tuple[str, str], SessionState] = OrderedDict()
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}
        self._unsaved: dict[tuple[str, str], int] = {}

    def limits(self, model: str | None) -> Limits:
        window = self.settings.context_window or window_for(model)
        return Limits(window, self.settings.context_budget_share)

    async def prepare(self, family: Family, payload: dict[str, Any], body_len: int,
                      identity: Identity, model: str | None, *, coding: bool,
                      keep: bool = True) -> SessionState | None:
        """The state the ``context`` slot renders this request with; None to
        pass the client's history through (layer 0, a side channel, disabled).
        ``model``: the requested model, which sizes the window (the body's, or the
        path's for Gemini: ``exchange.requested_model``).
        ``coding``: the request is a coding agent's turn (decided once per request).
        ``keep``: False for a turn memory does not keep (``Exchange.keep``): planned
        as usual, the state held in this process only, nothing written."""
        if not self.settings.context or not coding:
            return None
        history = adapter_for(family)
        key = (identity.tenant, identity.session)
        state = await self._state(key)
        limits = self.limits(model)
        now = self.clock()
        result = planner.plan(history, payload, body_len, state, limits, now)
        if result.action == "load":
            rows = await asyncio.to_thread(self.memory.read, in_tenant(
                identity.tenant, lambda c: cstore.distilled(c, identity.tenant,
                                                            identity.session)))
            # A rewrite measures every history item (tens of ms on a 400K-token
            # body): off the loop. The payload is only read.
            result = await asyncio.to_thread(planner.plan, history, payload, body_len, state,
                                             limits, now, rows)
        self._keep(key, result.state)
        if result.action == "rewrite":
            metrics.record_context_rewrite(result.reason, result.rendered)
            log.info("context: session %s rewritten at layer %d (%s, prefix %s), ~%d tokens",
                     identity.session[:16], result.state.layer, result.reason,
                     "re-rendered" if result.rendered else "kept", result.estimate)
            if keep:
                self._persist(key, result.state)
        if result.action in ("steady", "rewrite"):
            metrics.record_context_layer(result.state.layer)
        return result.state if result.action in ("steady", "rewrite") else None

    def observe(self, identity: Identity, sent_bytes: int, prompt_tokens: int,
                cache_read: int, *, keep: bool = True) -> None:
        """One upstream usage report (real, unscaled) for the session's last request
        (``keep``: False when that request's turn is not kept: calibrated here, not
        written; the next kept turn's write carries it)."""
        key = (identity.tenant, identity.session)
        state = self._states.get(key)
        if state is None:
            return
        self._keep(key, planner.calibrate(state, sent_bytes, prompt_tokens, cache_read))
        count = self._unsaved.get(key, 0) + 1
        if keep and (count >= PERSIST_EVERY or state.samples == 0):
            self._persist(key, self._states[key])
            count = 0
        self._unsaved[key] = count

    def overflow(self, identity: Identity, ratio: float | None, limit: int | None = None,
                 sent_bytes: int = 0, *, keep: bool = True) -> None:
        """A context-length error for a request of ``sent_bytes``: the next
        request goes out at a higher layer (within the window the error
        reported, with the token count it reported, when it said)."""
        key = (identity.tenant, identity.session)
        state = planner.force_layer(self._states.get(key, SessionState()), ratio, limit,
                                    sent_bytes)
        self._keep(key, state)
        metrics.record_context_overflow()
        if keep:
            self._persist(key, state)

    def squeeze(self, identity: Identity, reserve_bytes: int, *, keep: bool = True) -> None:
        """A recall follow-up would not fit: the session's next plan leaves room
        for ``reserve_bytes`` more (the recall pairs), a self-caused rewrite
        like a budget one (nothing was refused)."""
        key = (identity.tenant, identity.session)
        state = planner.reserve(self._states.get(key, SessionState()), reserve_bytes)
        self._keep(key, state)
        if keep:
            self._persist(key, state)

    def fits(self, identity: Identity, model: str, sent_bytes: int) -> bool:
        """Whether a request of ``sent_bytes`` (a recall follow-up: the planned
        context plus the recall pairs) stays under the follow-up ceiling of the
        session's window, by its calibrated estimate."""
        state = self._states.get((identity.tenant, identity.session))
        if state is None:
            return True
        limits = self.limits(model)
        window = min(limits.window, state.window_cap or limits.window)
        ratio = state.ratio * (planner.UNCALIBRATED_SAFETY if state.samples == 0 else 1.0)
        return sent_bytes * ratio <= window * planner.follow_up_ceiling(limits.share)

    def current(self, tenant: str, session: str) -> SessionState | None:
        return self._states.get((tenant, session))

    async def _state(self, key: tuple[str, str]) -> SessionState:
        state = self._states.get(key)
        if state is not None:
            self._states.move_to_end(key)
            return state
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            state = self._states.get(key)
            if state is None:
                try:
                    state = await asyncio.to_thread(self.memory.read, in_tenant(
                        key[0], lambda c: cstore.load(c, key[0], key[1]))) or SessionState()
                except Exception:
                    log.exception("context: could not load session state; starting afresh")
                    state = SessionState()
                self._keep(key, state)
        return state

    def _keep(self, key: tuple[str, str], state: SessionState) -> None:
        self._states[key] = state
        self._states.move_to_end(key)
        while len(self._states) > MAX_SESSIONS:
            old, _ = self._states.popitem(last=False)
            self._locks.pop(old, None)
            self._unsaved.pop(old, None)

    def _persist(self, key: tuple[str, str], state: SessionState) -> None:
        """Queue the state's write on the writer thread (never waits)."""
        tenant, session = key
        self.memory.writer.submit_job(
            in_tenant(tenant, lambda c: cstore.save(c, tenant, session, state)))
