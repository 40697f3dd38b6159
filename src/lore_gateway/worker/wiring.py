"""Plugging knowledge, context management and the background worker into a
gateway (one call each way)."""

from __future__ import annotations

from typing import Any

from lore_gateway.config import Settings
from lore_gateway.context.service import ContextService
from lore_gateway.knowledge.service import KnowledgeService
from lore_gateway.upstream import UpstreamClient
from lore_gateway.worker.service import BackgroundWorker


class Background:
    """The gateway's knowledge service and worker, started and stopped together."""

    def __init__(self, settings: Settings, memory: Any, upstream: UpstreamClient) -> None:
        self.knowledge = KnowledgeService(settings, memory)
        self.context = ContextService(settings, memory)
        self.worker = BackgroundWorker(settings, memory, upstream, knowledge=self.knowledge)

    @classmethod
    async def attach(cls, settings: Settings, memory: Any, upstream: UpstreamClient,
                     proxy: Any, recall: Any) -> Background | None:
        """Start both for a gateway with a memory store; None without one."""
        if memory is None or not hasattr(memory, "write_job"):
            return None
        background = cls(settings, memory, upstream)
        if recall is not None:
            recall.knowledge = background.knowledge
            recall.context = background.context
        proxy.on_response_ended = background.worker.notify
        await background.worker.start()
        return background

    async def stop(self) -> None:
        await self.worker.stop()
