"""The thin asyncio shell of compaction: what the proxy asks, and the one IO step.

``usage_cap`` says whether this client's reported usage is scaled (pure, per
request). ``answer`` looks at a model request before it is forwarded: when it
is a compaction (``detect.py``) of a session the gateway remembers, it reads the
session's memory in a thread and returns the finished answer; otherwise None
and the request goes upstream untouched. Counted in the metrics and the status.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from lore_gateway.channel import JSON_HEADERS, SSE_HEADERS, RawHeaders
from lore_gateway.compaction import answers, detect, store, summary
from lore_gateway.compaction.detect import Flow
from lore_gateway.compaction.usage import Agent, UsageCap, claude_cap, client_agent, codex_cap
from lore_gateway.config import Settings
from lore_gateway.memory.service import Memory
from lore_gateway.memory.store.records import Identity
from lore_gateway.obs import metrics, status
from lore_gateway.protocols.history import adapter_for
from lore_gateway.routing import Family, Protocol, family_of
from lore_gateway.storage.base import Connection, in_tenant

log = logging.getLogger("lore.compaction")


@dataclass(frozen=True, slots=True)
class CompactionAnswer:
    """A compaction request's fate: the answer from memory, or (``body`` None, no
    memory of the session) forwarded untouched and not stored as a turn."""

    flow: Flow
    status: int = 200
    headers: RawHeaders = field(default_factory=list)
    body: bytes | None = None


# Answered and passed-through counts since start, per flow (for the status).
_counts: dict[str, int] = {}
_counts_lock = threading.Lock()


def _count(flow: Flow, outcome: str) -> None:
    with _counts_lock:
        key = f"{flow.value}:{outcome}"
        _counts[key] = _counts.get(key, 0) + 1
    metrics.record_compaction(flow.value, outcome)


# The agent whose structure a flow recognises (a compaction_trigger is answered
# for any client: it asks for exactly that).
_AGENT_OF = {Flow.CLAUDE_SUMMARY: Agent.CLAUDE_CODE, Flow.CODEX_LOCAL: Agent.CODEX}
# What each compacting agent speaks: its usage is scaled only there (an SDK
# request from the same machine through another protocol is not the agent's).
_SPEAKS = {Agent.CLAUDE_CODE: Family.ANTHROPIC, Agent.CODEX: Family.RESPONSES}


def usage_cap(settings: Settings, protocol: Protocol, headers: Mapping[str, str],
              payload: Mapping[str, Any]) -> UsageCap | None:
    """The cap on the usage this client is shown (None: its usage is not touched)."""
    if not settings.usage_scaling:
        return None
    agent = client_agent(headers)
    family = family_of(protocol)
    if agent is None or _SPEAKS[agent] is not family:
        return None
    if agent is Agent.CODEX:
        return UsageCap(codex_cap(settings.codex_window_tokens), adapter_for(family))
    max_tokens = payload.get("max_tokens")
    cap = claude_cap(settings.claude_window_tokens,
                     max_tokens if isinstance(max_tokens, int) else None)
    return UsageCap(cap, adapter_for(family))


class CompactionService:
    def __init__(self, settings: Settings, memory: Memory) -> None:
        """Built with memory only: then the request pipeline runs, and its
        ``expand_compaction`` slot turns a compaction item of ours that comes
        back into its summary, so our handle never reaches the provider."""
        self.settings = settings
        self.memory = memory

    async def answer(self, protocol: Protocol, payload: dict[str, Any],
                     headers: Mapping[str, str],
                     identity: Identity | None) -> CompactionAnswer | None:
        """None for any request but a compaction; for a compaction, the answer
        from memory (or, with no memory, one without a body: pass it through)."""
        if not self.settings.compaction_from_memory:
            return None
        flow = detect.detect(adapter_for(family_of(protocol)), payload, headers)
        if flow is None:
            return None
        # A summary prompt from any other client (an SDK user's own) is theirs.
        expected = _AGENT_OF.get(flow)
        if expected is not None and client_agent(headers) is not expected:
            return None
        text = await self._summary(identity)
        if text is None:
            _count(flow, "passthrough")
            log.info("compaction (%s) with no memory of the session: passed through", flow)
            return CompactionAnswer(flow)
        _count(flow, "answered")
        log.info("compaction (%s) answered from memory (%d chars)", flow, len(text))
        stream = payload.get("stream") is True
        model = str(payload.get("model") or "")
        if flow is Flow.CLAUDE_SUMMARY:
            body = answers.anthropic_answer(text, model, stream)
        elif flow is Flow.CODEX_TRIGGER:
            body = answers.responses_compaction_answer(text, model, stream)
        else:
            body = answers.responses_summary_answer(text, model, stream)
        return CompactionAnswer(flow, 200, SSE_HEADERS if stream else JSON_HEADERS, body)

    async def compact_endpoint(self, identity: Identity | None) -> bytes | None:
        """``POST …/responses/compact``: the new history from memory (None: pass through)."""
        if not self.settings.compaction_from_memory:
            return None
        text = await self._summary(identity)
        if text is None:
            _count(Flow.CODEX_COMPACT, "passthrough")
            return None
        _count(Flow.CODEX_COMPACT, "answered")
        return answers.compact_endpoint_body(text)

    async def _summary(self, identity: Identity | None) -> str | None:
        if identity is None:
            return None
        tokens = self.settings.knowledge_block_tokens if self.settings.knowledge else 0

        def read(conn: Connection) -> summary.SessionMemory:
            return store.session_memory(conn, identity.tenant, identity.project,
                                        identity.session, tokens)

        try:
            # On the writer, behind the turns still queued: the turn that ended
            # just before the agent asked is part of the summary.
            remembered = await asyncio.to_thread(self.memory.write_job,
                                                 in_tenant(identity.tenant, read))
        except Exception:
            log.exception("compaction: could not read the session's memory; passed through")
            return None
        if remembered.empty:
            return None
        return summary.render(remembered)


def _status(settings: Settings, _live: Any) -> dict[str, Any]:
    with _counts_lock:
        counts = dict(_counts)
    return {
        "usage_scaling": settings.usage_scaling,
        "client_caps": {"claude-code": claude_cap(settings.claude_window_tokens, None),
                        "codex": codex_cap(settings.codex_window_tokens)},
        "from_memory": settings.compaction_from_memory,
        "answered": {k.split(":")[0]: v for k, v in counts.items() if k.endswith(":answered")},
        "passed_through": {k.split(":")[0]: v for k, v in counts.items()
                           if k.endswith(":passthrough")},
    }


status.register_section("compaction", _status)
