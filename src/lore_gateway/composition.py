"""The composition root: every service of one gateway, built once, in one place.

Each service gets what it uses as constructor arguments, and nothing is set on
an object after it was built: a reader of ``build_gateway`` sees the whole graph.
Each feature exists or not on its own: without memory (``LORE_STORE=false``)
there is no recall, knowledge, context management, compaction answer nor
background work, and the request pipeline only applies the upstream's rules;
``LORE_RECALL=false`` leaves the pipeline's recall slot empty and keeps the
others (knowledge and context switch themselves off through their own
settings).

Building opens the memory store and reads the amnesia switch (both in a
thread); starting and stopping is ``Gateway``'s (server.py), through
:meth:`Assembly.start` and :meth:`Assembly.close`.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from functools import partial

from lore_gateway.app import GatewayApp
from lore_gateway.compaction.service import CompactionService
from lore_gateway.config import Settings
from lore_gateway.context.service import ContextService
from lore_gateway.knowledge.service import KnowledgeService
from lore_gateway.memory.data.amnesia import AmnesiaSwitch
from lore_gateway.memory.service import Memory
from lore_gateway.memory.store.anchor_store import AnchorStore
from lore_gateway.pipeline.request import RequestPipeline
from lore_gateway.proxy import Proxy
from lore_gateway.recall.replay import AnchorReplay
from lore_gateway.recall.service import RecallService
from lore_gateway.storage import db
from lore_gateway.turns import TurnSink
from lore_gateway.upstream import UpstreamClient
from lore_gateway.worker.service import BackgroundWorker


@dataclass(frozen=True, slots=True)
class Background:
    """The services that learn from finished turns: knowledge (which the request
    pipeline also reads), context management's state, and the worker that runs
    distillation and curation after a response ended."""

    knowledge: KnowledgeService
    context: ContextService
    worker: BackgroundWorker


@dataclass(frozen=True, slots=True)
class Assembly:
    """One gateway's services, as ``build_gateway`` wired them."""

    settings: Settings
    memory: Memory | None
    upstream: UpstreamClient
    amnesia: AmnesiaSwitch | None
    background: Background | None
    recall: RecallService | None
    proxy: Proxy
    app: GatewayApp

    async def start(self) -> None:
        """Open the upstream pool and start the background worker."""
        await self.upstream.start()
        if self.background is not None:
            await self.background.worker.start()

    async def close(self) -> None:
        """Stop what ``start`` started and close what ``build_gateway`` opened,
        memory last (the others write through it)."""
        await asyncio.to_thread(self.app.ui.close)  # the last metrics sample
        await self.app.mcp.close()
        if self.background is not None:
            await self.background.worker.stop()
        await self.upstream.close()
        if self.recall is not None:
            # The anchor store's queued writes.
            await asyncio.to_thread(self.recall.replay.store.close)
        if self.amnesia is not None:
            await asyncio.to_thread(self.amnesia.close)
        if self.memory is not None:
            await asyncio.to_thread(self.memory.close)


async def build_gateway(settings: Settings) -> Assembly:
    """Every service of a gateway for ``settings``, wired; nothing started."""
    memory = None
    if settings.store:
        memory = await asyncio.to_thread(partial(Memory.open, settings,
                                                 turn_process=settings.store_process))
    upstream = UpstreamClient(settings)
    amnesia = None
    if memory is not None:
        # `lore amnesia` and /ui's switch (memory/data/amnesia.py), read off the loop.
        amnesia = await asyncio.to_thread(AmnesiaSwitch, db.conn_factory(memory.database))
    turns = TurnSink(memory, max_json_bytes=settings.max_response_body_bytes,
                     max_stored_chars=settings.store_max_message_bytes + 1, amnesia=amnesia)
    if memory is None:
        proxy = Proxy(settings, upstream, turns, RequestPipeline())
        return Assembly(settings, None, upstream, None, None, None, proxy,
                        GatewayApp(proxy, memory_degraded=lambda: None))
    knowledge = KnowledgeService(settings, memory)
    context = ContextService(settings, memory)
    background = Background(knowledge, context, BackgroundWorker(
        settings, memory, upstream, knowledge=knowledge))
    anchors = AnchorReplay(AnchorStore(writer=memory.writer)) if settings.recall else None
    pipeline = RequestPipeline(anchors=anchors, knowledge=knowledge, context=context)
    recall = None
    if anchors is not None:
        recall = RecallService(memory, upstream, anchors, fit=pipeline.fit)
    proxy = Proxy(settings, upstream, turns, pipeline, recall=recall,
                  compaction=CompactionService(settings, memory),
                  on_response_ended=background.worker.notify)
    app = GatewayApp(proxy, memory_degraded=lambda: memory.degraded)
    return Assembly(settings, memory, upstream, amnesia, background, recall, proxy, app)
