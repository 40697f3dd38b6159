"""One background model request: within the tenant's budget, with its timeout.

The request goes to the session's own upstream in its protocol family, with its
credential and ``x-lore-worker: <job>``; the tokens it used are charged to the
tenant's daily ledger.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import orjson

from lore_gateway.config import Settings
from lore_gateway.distill import format as fmt
from lore_gateway.obs import metrics
from lore_gateway.upstream import UpstreamClient, UpstreamUnavailable
from lore_gateway.worker import jobs
from lore_gateway.worker import requests as wreq
from lore_gateway.worker.credentials import SessionUpstream

WORKER_HEADER = "x-lore-worker"
# Largest worker answer read.
MAX_ANSWER_BYTES = 4 * 1024 * 1024


class WorkerUnavailable(Exception):
    """The model may not or cannot be asked now. The message starts with why:
    ``off:``, ``budget:``, ``no credential:`` or ``retry:`` (worth another try)."""


class _UpstreamStatus(Exception):
    """A non-2xx answer to a worker request."""


class ModelCaller:
    def __init__(self, settings: Settings, memory: Any, upstream: UpstreamClient,
                 clock: Callable[[], float]) -> None:
        self.settings = settings
        self.memory = memory
        self.upstream = upstream
        self.clock = clock
        self.tokens_in = 0
        self.tokens_out = 0

    def model_for(self, upstream: SessionUpstream) -> str:
        configured = {"anthropic": self.settings.worker_model_anthropic,
                      "codex": self.settings.worker_model_chatgpt}.get(
            upstream.family, self.settings.worker_model_openai)
        if configured == "session" and upstream.model:
            return upstream.model
        return configured

    async def ask(self, tenant: str, upstream: SessionUpstream, kind: str, system: str,
                  user: str, max_tokens: int) -> str:
        """One worker request within the budget; the answer's text."""
        estimate = fmt.estimate_tokens(system + user) + max_tokens
        daily = self.settings.worker_daily_tokens
        spent = await asyncio.to_thread(self.memory.read,
                                        lambda c: jobs.used(c, tenant, self.clock()))
        if spent + estimate > daily:
            raise WorkerUnavailable(f"budget: {spent} of {daily} worker tokens used today")
        family = upstream.family
        body = orjson.dumps(wreq.build(family, self.model_for(upstream), system, user,
                                       max_tokens))
        headers = [*upstream.headers, ("content-type", "application/json"),
                   (WORKER_HEADER, kind)]
        try:
            raw = await asyncio.wait_for(self._send(upstream.url, headers, body),
                                         self.settings.worker_timeout)
            answer = wreq.parse(family, raw)
        except TimeoutError:
            metrics.record_worker_request(kind, "timeout", 0, 0, None)
            raise WorkerUnavailable("retry: the worker request timed out") from None
        except (UpstreamUnavailable, wreq.WorkerAnswerError, _UpstreamStatus) as exc:
            metrics.record_worker_request(kind, "error", 0, 0, None)
            raise WorkerUnavailable(f"retry: {exc}") from None
        n_in = answer.tokens_in if answer.tokens_in is not None else fmt.estimate_tokens(
            system + user)
        n_out = answer.tokens_out if answer.tokens_out is not None else fmt.estimate_tokens(
            answer.text)

        def charge(conn: Any) -> int:
            jobs.charge(conn, tenant, self.clock(), n_in, n_out)
            return jobs.used(conn, tenant, self.clock())

        used = await asyncio.to_thread(self.memory.write_job, charge)
        self.tokens_in += n_in
        self.tokens_out += n_out
        metrics.record_worker_request(kind, "ok", n_in, n_out, daily - used)
        return answer.text

    async def _send(self, url: str, headers: list[tuple[str, str]], body: bytes) -> bytes:
        resp = await self.upstream.send("POST", url, headers, body)
        try:
            data, _cut = await resp.read(MAX_ANSWER_BYTES)
        finally:
            resp.close()
        if resp.status >= 300:
            raise _UpstreamStatus(f"upstream answered {resp.status}")
        return data
