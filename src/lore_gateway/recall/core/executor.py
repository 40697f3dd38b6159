"""Running one recall against the memory (lore-spec B.3, B.4, B.9).

The executor turns validated arguments into the tool result the model reads, plus
*private* coverage (which stored items came back, with their scores). Coverage
feeds the chain budget and diagnostics only; it is deliberately a separate field
and never rendered, so nothing downstream can leak it to the client by accident.

Searches and detail reads run off the event loop (``Memory.search`` /
``Memory.detail`` use the memory's search workers). A :class:`SearchGate` shared
by every request bounds how many run or wait at once, and each is awaited with a
timeout: under load a recall fails fast with a defined category
(``recall_unavailable``: memory busy; ``recall_timeout``: memory too slow) and
the model gets a short text saying so, instead of the answer stalling.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeVar

from lore_gateway.memory.search.hits import SearchResult
from lore_gateway.memory.store.records import Identity
from lore_gateway.recall.core.budget import Coverage
from lore_gateway.recall.core.tool import DEFAULT_DETAIL_LIMIT, RecallArgs
from lore_gateway.storage.errors import StorageUnavailable

log = logging.getLogger(__name__)

# B.4: the model's view of one search is at most 12,000 characters, 15 results.
SEARCH_BUDGET_CHARS = 12_000
SEARCH_LIMIT = 15
# B.4: a batch of ids shares one 32,000 code-point budget.
BATCH_BUDGET_CHARS = 32_000

NO_RESULTS = "[No results found.]"
EXECUTION_FAILED = "Recall search failed. The memory system encountered an error."
UNAVAILABLE = ("Recall is unavailable right now: the memory system is busy. "
               "Answer without it, or try again later.")
DATABASE_UNREACHABLE = ("Recall is unavailable right now: the memory database cannot be "
                        "reached. Answer without it, or try again later.")
TIMED_OUT = ("Recall timed out: the memory system did not answer in time. "
             "Answer without it, or try again later.")

# Searches in flight at once, over every request of the gateway; beyond it a
# recall fails fast as busy (issue 10 §3) instead of queueing without bound. The
# search children answer in order, one at a time each, so this is also how long
# their queue can get: 96 searches of 10-20 ms is about a second on two
# children, well inside the search timeout. (There used to be a second bound, 32
# running, from when searches ran on threads whose hand-offs needed this
# process's GIL; with the children driven over sockets it only queued searches
# in the gateway, one loop iteration per hand-over of a slot: a quarter of a
# second per recall under the soak.) The search process bounds its own queue at
# 256.
MAX_IN_FLIGHT_SEARCHES = 96
# One search or detail read, waited for at most this long (an idle search takes
# 13–132 ms here; one that takes seconds is stuck behind something).
DEFAULT_SEARCH_TIMEOUT_S = 10.0

FailureKind = Literal["recall_unavailable", "recall_timeout", "recall_execution"]
T = TypeVar("T")


class RecallMemory(Protocol):
    """The part of :class:`lore_gateway.memory.service.Memory` recall uses."""

    async def search(
        self, query: str, *, identity: Identity, scope: str = "all", limit: int = 10
    ) -> SearchResult: ...

    def render(self, result: SearchResult, budget_chars: int = 12_000) -> str: ...

    async def detail(self, ref: str, *, tenant: str, offset: int = 0, limit: int = ...) -> str: ...


@dataclass(frozen=True, slots=True)
class RecallOutcome:
    """``text`` goes to the model; ``coverage`` stays inside the gateway."""

    text: str
    coverage: tuple[Coverage, ...]
    failed: bool = False
    failure: FailureKind | None = None  # why it failed (a C.7-style category)


class MemoryBusy(Exception):
    """Too many recall searches are already running or waiting."""


class SearchGate:
    """Bounds the recall searches of one gateway: at most ``limit`` in flight,
    each awaited at most ``timeout`` seconds. Admission is a counter, never a
    wait: a search is refused or started at once."""

    def __init__(self, *, limit: int = MAX_IN_FLIGHT_SEARCHES,
                 timeout: float = DEFAULT_SEARCH_TIMEOUT_S) -> None:
        self._admitted = 0
        self._limit = limit
        self.timeout = timeout

    @property
    def in_flight(self) -> int:
        """Searches in flight now."""
        return self._admitted

    async def run(self, work: Awaitable[T]) -> T:
        """Await ``work``; :class:`MemoryBusy` when ``limit`` searches are already
        in flight, ``TimeoutError`` when it took longer than ``timeout``."""
        if self._admitted >= self._limit:
            _close(work)
            raise MemoryBusy(f"{self._admitted} recall searches in flight")
        self._admitted += 1
        try:
            async with asyncio.timeout(self.timeout):
                return await work
        finally:
            self._admitted -= 1
            _close(work)


def _close(work: Awaitable[Any]) -> None:
    """Close a coroutine that was never awaited (no "never awaited" warning)."""
    if asyncio.iscoroutine(work):
        work.close()


def _revision(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def _search_coverage(result: SearchResult) -> tuple[Coverage, ...]:
    """Coverage from a search: one entry per hit, by its reference."""
    return tuple(Coverage(identity=hit.ref, revision=_revision(hit.content), score=hit.score)
                 for hit in result.hits)


class RecallExecutor:
    """Runs recalls for one client request (one identity)."""

    def __init__(self, memory: RecallMemory, identity: Identity,
                 gate: SearchGate | None = None) -> None:
        self._memory = memory
        self._identity = identity
        self._gate = gate or SearchGate()

    async def run(self, args: RecallArgs) -> RecallOutcome:
        """Execute; a memory failure becomes a failure text for the model, never an
        exception (the model can still answer without memory)."""
        try:
            if args.ids is not None:
                return await self._batch(args.ids)
            if args.id is not None:
                return await self._detail(
                    args.id, args.detail_offset or 0, args.detail_limit or DEFAULT_DETAIL_LIMIT
                )
            return await self._search(args.query or "", args.scope)
        except MemoryBusy as exc:
            log.warning("recall refused: %s", exc)
            return RecallOutcome(UNAVAILABLE, (), failed=True, failure="recall_unavailable")
        except StorageUnavailable as exc:
            log.warning("recall without memory: %s", exc)
            return RecallOutcome(DATABASE_UNREACHABLE, (), failed=True,
                                 failure="recall_unavailable")
        except TimeoutError:
            log.warning("recall timed out after %.1f s", self._gate.timeout)
            return RecallOutcome(TIMED_OUT, (), failed=True, failure="recall_timeout")
        except Exception as exc:
            log.warning("recall execution failed: %s", type(exc).__name__)
            return RecallOutcome(EXECUTION_FAILED, (), failed=True, failure="recall_execution")

    async def _search(self, query: str, scope: str) -> RecallOutcome:
        result = await self._gate.run(self._memory.search(
            query, identity=self._identity, scope=scope, limit=SEARCH_LIMIT
        ))
        text = self._memory.render(result, SEARCH_BUDGET_CHARS)
        return RecallOutcome(text=text or NO_RESULTS, coverage=_search_coverage(result))

    async def _detail(self, ref: str, offset: int, limit: int) -> RecallOutcome:
        text = await self._gate.run(self._memory.detail(
            ref, tenant=self._identity.tenant, offset=offset, limit=limit
        ))
        found = not text.startswith(("No entry found", "Unknown source prefix"))
        coverage = (
            (Coverage(identity=ref, revision=_revision(text), kind="detail"),) if found else ()
        )
        return RecallOutcome(text=text or NO_RESULTS, coverage=coverage)

    async def _batch(self, refs: tuple[str, ...]) -> RecallOutcome:
        blocks = ["## Recall Details"]
        coverage: list[Coverage] = []
        remaining = BATCH_BUDGET_CHARS
        for ref in dict.fromkeys(refs):
            if remaining <= 0:
                blocks.append(
                    f"### Detail: {ref}\nOutcome: omitted — batch output limit reached; "
                    "fetch this ID separately."
                )
                continue
            one = await self._detail(ref, 0, min(DEFAULT_DETAIL_LIMIT, remaining))
            outcome = "delivered" if one.coverage else "unavailable"
            blocks.append(f"### Detail: {ref}\nOutcome: {outcome}\n\n{one.text}")
            remaining -= len(one.text)
            coverage.extend(one.coverage)
        return RecallOutcome(text="\n\n".join(blocks), coverage=tuple(coverage))
