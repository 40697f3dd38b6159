"""Recall follow-ups that fit the model's window (the chain's ``FollowUpFit``).

A follow-up is the planned upstream context plus the recall pairs of the
chain so far, so a chain of long results can outgrow what context management
planned for the request. Before each follow-up goes out, its calibrated
estimate is checked against the follow-up ceiling (the budget share plus a
little, ``planner.follow_up_ceiling``); over it, the session is re-planned one
layer up and the follow-up rebuilt on the smaller context. If the provider
still refuses one as too long, it is re-planned with the token count the error
reported and sent once more. Every later follow-up of the chain is built on the
same re-planned context, so each is still a byte-for-byte extension of the one
before, and the next client request renders that same context (the state is
the session's).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from lore_gateway.context import overflow as context_overflow
from lore_gateway.context.service import ContextService
from lore_gateway.memory.store.records import Identity

# Re-plans before one follow-up is sent: the first makes room for the recall
# pairs at the session's layer, a second corrects for an estimate that was off;
# past that the follow-up goes as it is and the provider decides.
MAX_REPLANS = 2
# The upstream's base history items re-planned (None: none could be made).
Rebase = Callable[[], Awaitable[list[Any] | None]]


class ContextFit:
    """Fits one request's recall follow-ups to its session's window."""

    def __init__(self, context: ContextService, identity: Identity, model: str, key: str,
                 base_len: int, rebase: Rebase, *, keep: bool = True) -> None:
        self.context = context
        # False: the request's turn is not kept; re-plans change no stored state.
        self.keep = keep
        self.identity = identity
        self.model = model
        self.key = key  # "messages" or "input"
        self.base_len = base_len  # history items of the request the chain started from
        self.rebase = rebase
        self.base: list[Any] | None = None  # the re-planned history, once there is one
        self.retried = False

    async def before(self, body: dict[str, Any]) -> dict[str, Any]:
        extra = self._extra(body, self.base_len)
        fitted = self._on_base(body, extra)
        for _ in range(MAX_REPLANS):
            if self.context.fits(self.identity, self.model, len(orjson.dumps(fitted))):
                break
            # Room for the pairs: the context is re-planned as if they were
            # already part of it (they will be, in the next client request).
            self.context.squeeze(self.identity, len(orjson.dumps(extra)), keep=self.keep)
            if not await self._replan():
                break
            fitted = self._on_base(body, extra)
        return fitted

    async def after_refusal(self, body: dict[str, Any], status: int,
                            error: bytes) -> dict[str, Any] | None:
        found = context_overflow.detect(status, error)
        if found is None or self.retried:
            return None
        self.retried = True
        extra = self._extra(body, len(self.base) if self.base is not None else self.base_len)
        self.context.overflow(self.identity, found.ratio, found.limit, len(orjson.dumps(body)),
                              keep=self.keep)
        if not await self._replan():
            return None
        return self._on_base(body, extra)

    async def _replan(self) -> bool:
        base = await self.rebase()
        if base is None:
            return False
        self.base = base
        return True

    def _extra(self, body: dict[str, Any], start: int) -> list[Any]:
        items = body.get(self.key)
        return list(items[start:]) if isinstance(items, list) else []

    def _on_base(self, body: dict[str, Any], extra: list[Any]) -> dict[str, Any]:
        if self.base is None:
            return body
        return {**body, self.key: [*self.base, *extra]}
