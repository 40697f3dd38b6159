"""One background model request: within the tenant's budget, with its timeout.

The request goes to the session's own upstream in its protocol family, with its
credential and ``x-lore-worker: <job>``; the tokens it used are charged to the
tenant's daily ledger.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

import orjson

from lore_gateway.config import Settings
from lore_gateway.distill import format as fmt
from lore_gateway.memory.store.sanitize import redact_credentials
from lore_gateway.obs import metrics
from lore_gateway.storage.base import Connection, in_tenant
from lore_gateway.upstream import UpstreamClient, UpstreamUnavailable
from lore_gateway.worker import jobs
from lore_gateway.worker import requests as wreq
from lore_gateway.worker.credentials import SessionUpstream

if TYPE_CHECKING:
    from lore_gateway.memory.service import Memory

WORKER_HEADER = "x-lore-worker"
# Largest worker answer read.
MAX_ANSWER_BYTES = 4 * 1024 * 1024


class WorkerUnavailable(Exception):
    """The model may not or cannot be asked now. The message starts with why:
    ``off:``, ``budget:``, ``no credential:`` or ``retry:`` (worth another try)."""


class _UpstreamStatus(Exception):
    """A non-2xx answer to a worker request."""

    def __init__(self, status: int) -> None:
        super().__init__(f"upstream answered {status}")
        self.status = status


# Answers that mean "no such model here" (the ChatGPT backend refuses most
# siblings of the session's model): the worker then uses the session's model.
_MODEL_REFUSED = (400, 404)


class ModelCaller:
    def __init__(self, settings: Settings, memory: Memory, upstream: UpstreamClient,
                 clock: Callable[[], float]) -> None:
        self.settings = settings
        self.memory = memory
        self.upstream = upstream
        self.clock = clock
        self.tokens_in = 0
        self.tokens_out = 0
        # (family, url) whose upstream refused the configured worker model.
        self._use_session_model: set[tuple[str, str]] = set()

    def model_for(self, upstream: SessionUpstream) -> str:
        """The configured cheaper model, or the session's own when configured so
        or when this upstream refused the cheaper one."""
        configured = {"anthropic": self.settings.worker_model_anthropic,
                      "codex": self.settings.worker_model_chatgpt,
                      "gemini": self.settings.worker_model_gemini}.get(
            upstream.family, self.settings.worker_model_openai)
        refused = (upstream.family, upstream.url) in self._use_session_model
        if (configured == "session" or refused) and upstream.model:
            return upstream.model
        return configured

    async def ask(self, tenant: str, upstream: SessionUpstream, kind: str, system: str,
                  user: str, max_tokens: int) -> str:
        """One worker request within the budget; the answer's text."""
        estimate = fmt.estimate_tokens(system + user) + max_tokens
        daily = self.settings.worker_daily_tokens
        spent = await asyncio.to_thread(self.memory.read, in_tenant(
            tenant, lambda c: jobs.used(c, tenant, self.clock())))
        if spent + estimate > daily:
            raise WorkerUnavailable(f"budget: {spent} of {daily} worker tokens used today")
        family = upstream.family
        headers = [*upstream.headers, ("content-type", "application/json"),
                   (WORKER_HEADER, kind)]
        try:
            model = self.model_for(upstream)
            try:
                raw = await self._post(upstream, headers, model, system, user, max_tokens)
            except _UpstreamStatus as exc:
                if exc.status not in _MODEL_REFUSED or not upstream.model or \
                        model == upstream.model:
                    raise
                self._use_session_model.add((family, upstream.url))
                raw = await self._post(upstream, headers, upstream.model, system, user,
                                       max_tokens)
            answer = wreq.parse(family, raw)
        except TimeoutError:
            metrics.record_worker_request(kind, "timeout", 0, 0, None)
            raise WorkerUnavailable("retry: the worker request timed out") from None
        except (UpstreamUnavailable, wreq.WorkerAnswerError, _UpstreamStatus) as exc:
            metrics.record_worker_request(kind, "error", 0, 0, None)
            # The reason is stored with the job: never a URL's ``?key=``.
            raise WorkerUnavailable(f"retry: {redact_credentials(str(exc))}") from None
        n_in = answer.tokens_in if answer.tokens_in is not None else fmt.estimate_tokens(
            system + user)
        n_out = answer.tokens_out if answer.tokens_out is not None else fmt.estimate_tokens(
            answer.text)

        def charge(conn: Connection) -> int:
            jobs.charge(conn, tenant, self.clock(), n_in, n_out)
            return jobs.used(conn, tenant, self.clock())

        used = await asyncio.to_thread(self.memory.write_job, in_tenant(tenant, charge))
        self.tokens_in += n_in
        self.tokens_out += n_out
        metrics.record_worker_request(kind, "ok", n_in, n_out, daily - used)
        return answer.text

    async def _post(self, upstream: SessionUpstream, headers: list[tuple[str, str]], model: str,
                    system: str, user: str, max_tokens: int) -> bytes:
        body = orjson.dumps(wreq.build(upstream.family, model, system, user, max_tokens))
        url = wreq.url(upstream.family, upstream.url, model)
        async with asyncio.timeout(self.settings.worker_timeout):
            return await self._send(url, headers, body)

    async def _send(self, url: str, headers: list[tuple[str, str]], body: bytes) -> bytes:
        resp = await self.upstream.send("POST", url, headers, body)
        try:
            data, _cut = await resp.read(MAX_ANSWER_BYTES)
        finally:
            resp.close()
        if resp.status >= 300:
            raise _UpstreamStatus(resp.status)
        return data
