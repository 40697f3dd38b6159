"""The background worker: one asyncio task per gateway, off the request path.

The proxy calls ``notify`` once a coding turn's response has fully reached the
client; that only records the session (and its upstream and credential, in
memory) and wakes the task. The task plans jobs, persists them in
``worker_jobs``, and runs them one at a time: every database step in a thread,
every model call through the shared upstream client with its own timeout. A
failing or hung upstream costs a background job, never an agent's response.

Distill jobs use the worker model when it is allowed (on, budget left,
credential present, upstream answering) and the extractive distiller otherwise.
Curate jobs need the model; without it they wait (budget: until the next day).

Gateways that share one database each run a worker; every job is leased
(``jobs.claim``) before it runs and its result is saved only while the lease
holds, so each job runs once across instances (docs/storage.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from lore_gateway.config import Settings
from lore_gateway.distill import format as fmt
from lore_gateway.distill import prompts
from lore_gateway.distill import store as dstore
from lore_gateway.distill.extractive import SourceMessage
from lore_gateway.knowledge import curator
from lore_gateway.knowledge import store as kstore
from lore_gateway.knowledge.service import KnowledgeService, agents_file
from lore_gateway.memory.tenancy.identity import UNKNOWN_PROJECT
from lore_gateway.obs import metrics
from lore_gateway.routing import Family, Protocol
from lore_gateway.storage.base import Connection, in_tenant
from lore_gateway.upstream import UpstreamClient
from lore_gateway.worker import jobs
from lore_gateway.worker import requests as wreq
from lore_gateway.worker.client import ModelCaller, WorkerUnavailable
from lore_gateway.worker.credentials import CredentialVault, SessionUpstream, kept_headers
from lore_gateway.worker.status import job_facts, worker_settings

if TYPE_CHECKING:
    from lore_gateway.exchange import Exchange
    from lore_gateway.memory.service import Memory

log = logging.getLogger("lore.worker")

# How often the task looks for due jobs and idle sessions without a wake-up.
POLL_S = 5.0
# Sessions remembered for the idle trigger; the oldest are forgotten first.
MAX_TRACKED_SESSIONS = 1_024
# A curate job that could not reach the model for this long is given up (its
# logs stay uncurated; the next curate of the project picks them up).
CURATE_WAIT_S = 2 * 24 * 3600.0
# Shortest sleep between passes: a burst of due work never spins the loop.
MIN_SLEEP_S = 0.05
# Jobs taken per pass, so a backlog yields to new wake-ups.
JOBS_PER_PASS = 8
# Smallest rest distilled on idle: below this a segment is not worth a log.
MIN_IDLE_TOKENS = 64
# A queued distill job whose session lent no credential for this long (a restart
# forgot it) is distilled extractively instead of waiting any longer.
CREDENTIAL_WAIT_S = 600.0
# A running job's lease: renewed every LEASE_RENEW_S while the job runs, so an
# instance that dies mid-job frees it within LEASE_S, and a live one keeps it
# however long its model call takes.
LEASE_S = 30.0
LEASE_RENEW_S = 10.0
_FAMILY: dict[Protocol, wreq.Family] = {
    Protocol.ANTHROPIC: "anthropic", Protocol.RESPONSES: "responses", Protocol.CODEX: "codex",
    Protocol.CHAT: "chat", Protocol.GEMINI: "gemini"}


@dataclass(slots=True)
class _Seen:
    project: str
    at: float
    idle_done: bool = False


class BackgroundWorker:
    def __init__(self, settings: Settings, memory: Memory, upstream: UpstreamClient, *,
                 knowledge: KnowledgeService | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.memory = memory
        self.upstream = upstream
        self.clock = clock
        self.vault = CredentialVault()
        self.knowledge = knowledge
        self._seen: OrderedDict[tuple[str, str], _Seen] = OrderedDict()
        self._planned: set[tuple[str, str]] = set()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.caller = ModelCaller(settings, memory, upstream, lambda: self.clock())
        self._retry_at: float | None = None
        # Names this process in job leases: unique across the instances sharing
        # a database, readable in `lore status` (host, pid).
        self.instance = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        self.lease_s = LEASE_S

    # --- the proxy's side ------------------------------------------------------------

    def notify(self, exchange: Exchange) -> None:
        """A coding turn's response ended: remember the session and wake the task."""
        identity = exchange.identity
        protocol = exchange.protocol
        if identity is None or protocol not in _FAMILY:
            return
        if not exchange.coding:
            return
        key = (identity.tenant, identity.session)
        if self.settings.worker:
            self.vault.put(identity.tenant, identity.session, SessionUpstream(
                family=_FAMILY[protocol], url=exchange.upstream_url, model=exchange.model,
                project=identity.project, headers=kept_headers(exchange.upstream_headers)))
        self._seen.pop(key, None)
        self._seen[key] = _Seen(identity.project, self.clock())
        while len(self._seen) > MAX_TRACKED_SESSIONS:
            self._seen.popitem(last=False)
        if len(self._planned) < MAX_TRACKED_SESSIONS:  # else the idle trigger covers it
            self._planned.add(key)
        self._wake.set()

    # --- lifecycle -------------------------------------------------------------------

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="lore-worker")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
            try:
                await asyncio.to_thread(self.memory.write_job,
                                        lambda c: jobs.release(c, self.instance))
            except Exception as exc:  # the lease then runs out on its own
                log.warning("worker: could not release job leases at stop: %s", exc)

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._sleep_s()):
                    await self._wake.wait()
            self._wake.clear()
            try:
                await self._pass()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("worker: a pass failed; it runs again on the next wake-up")

    def _sleep_s(self) -> float:
        """Until the next thing that may be due: a retry, an idle session, or the poll."""
        now = self.clock()
        soonest = POLL_S
        if self._retry_at is not None:
            soonest = min(soonest, self._retry_at - now)
        for seen in self._seen.values():
            if not seen.idle_done:
                soonest = min(soonest, seen.at + self.settings.distill_idle_s - now)
        return max(MIN_SLEEP_S, soonest)

    async def _pass(self) -> None:
        self._retry_at = None
        now = self.clock()
        planned, self._planned = self._planned, set()
        for key in planned:
            seen = self._seen.get(key)
            if seen is not None:
                await self._plan(key, seen.project, self.settings.distill_segment_tokens)
        for key, seen in list(self._seen.items()):
            if not seen.idle_done and now - seen.at >= self.settings.distill_idle_s:
                seen.idle_done = True
                await self._plan(key, seen.project, MIN_IDLE_TOKENS)
        for _ in range(JOBS_PER_PASS):
            job = await asyncio.to_thread(self.memory.write_job, lambda c: jobs.claim(
                c, self.instance, self.clock(), self.lease_s))
            if job is None:
                break
            await self._run_job(job)

    async def _plan(self, key: tuple[str, str], project: str, threshold: int) -> None:
        tenant, session = key

        def plan(conn: Connection) -> bool:
            if dstore.undistilled_tokens(conn, tenant, session) < max(1, threshold):
                return False
            return jobs.enqueue(conn, "distill", tenant, project, session, self.clock(),
                                owner=self.instance)

        if await asyncio.to_thread(self.memory.write_job, plan):
            self._wake.set()

    # --- jobs ------------------------------------------------------------------------

    async def _run_job(self, job: jobs.Job) -> None:
        renewal = asyncio.create_task(self._renew(job), name="lore-worker-lease")
        try:
            await self._run_job_leased(job)
        finally:
            renewal.cancel()
            await asyncio.gather(renewal, return_exceptions=True)

    async def _renew(self, job: jobs.Job) -> None:
        """Keep the job's lease while it runs (a task beside it)."""
        while True:
            await asyncio.sleep(LEASE_RENEW_S)
            try:
                held = await asyncio.to_thread(self.memory.write_job, lambda c: jobs.renew(
                    c, job.id, self.instance, self.clock() + self.lease_s))
            except Exception as exc:
                log.warning("worker: could not renew the lease of job %d: %s", job.id, exc)
                continue
            if not held:
                return

    async def _run_job_leased(self, job: jobs.Job) -> None:
        try:
            if job.kind == "distill":
                await self._distill(job)
            elif job.kind == "curate":
                await self._curate(job)
            else:
                await self._finish(job, "failed", f"unknown job kind {job.kind!r}")
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("worker: %s job %d failed", job.kind, job.id)
            await self._finish(job, "failed", str(exc)[:500])

    async def _distill(self, job: jobs.Job) -> None:
        segment = await asyncio.to_thread(self.memory.read, in_tenant(
            job.tenant, lambda c: dstore.next_segment(c, job.tenant, job.session,
                                                      dstore.MAX_SEGMENT_TOKENS)))
        if not segment:
            await self._finish(job, "done")
            return
        method = "extractive"
        text: str | None = None
        try:
            upstream = self._upstream_for(job)
            system, user, budget = prompts.observer_prompt(segment)
            answer = await self.caller.ask(job.tenant, upstream, "distill", system, user, budget)
            _, observations = fmt.parse(answer)
            if not observations:
                raise WorkerUnavailable("retry: the worker answer held no observations")
            date = fmt.date_line(segment[0].created_at)
            text = fmt.render(date, fmt.fit(observations, budget * fmt.CHARS_PER_TOKEN))
            method = "worker"
        except WorkerUnavailable as exc:
            if not await self._fallback_now(job, str(exc)):
                return
        if text is None:
            from lore_gateway.distill import extractive

            text = extractive.distill(segment)

        curate = bool(text) and self.settings.worker and job.project != UNKNOWN_PROJECT

        def queue_curate(conn: Connection) -> None:
            jobs.enqueue(conn, "curate", job.tenant, job.project, job.session,
                         self.clock(), owner=self.instance)

        def save(conn: Connection) -> int | None:
            with conn:
                if not jobs.holds(conn, job.id, self.instance, self.clock()):
                    return _LEASE_LOST
                row = dstore.save(conn, tenant=job.tenant, project=job.project,
                                  session=job.session, text=text or "", sources=segment,
                                  generation=0, method=method)
                if curate:
                    queue_curate(conn)
                jobs.finish(conn, job.id, "done", self.clock(), instance=self.instance)
                if dstore.undistilled_tokens(conn, job.tenant, job.session) >= \
                        self.settings.distill_segment_tokens:
                    jobs.enqueue(conn, "distill", job.tenant, job.project, job.session,
                                 self.clock(), owner=self.instance)
                return row

        row = await asyncio.to_thread(self.memory.write_job, in_tenant(job.tenant, save))
        if row == _LEASE_LOST:
            log.warning("worker: distill job %d: its lease ran out before the result was "
                        "saved; another instance runs it", job.id)
            return
        metrics.record_worker_job("distill", method)
        if row is not None and curate:
            # The enqueue above is a no-op while another instance's curate job holds
            # the slot. On Postgres that job may finish and look for logs left over
            # before this transaction commits, and miss this one: queued again now
            # that the log is visible (a no-op if a job is still queued or running,
            # which then sees it).
            await asyncio.to_thread(self.memory.write_job, in_tenant(job.tenant, queue_curate))
        if row is not None:
            metrics.record_distillation(method, 0)
            await self._consolidate(job, use_model=method == "worker")
        self._wake.set()

    async def _consolidate(self, job: jobs.Job, *, use_model: bool) -> None:
        """Merge the session's first-level logs into one once there are too many:
        with the model when it just answered, else extractively."""
        threshold = self.settings.distill_consolidate_after
        gen0 = await asyncio.to_thread(self.memory.read, in_tenant(
            job.tenant, lambda c: dstore.active(c, job.tenant, job.session, 0)))
        if len(gen0) <= threshold:
            return
        method = "extractive"
        if use_model:
            try:
                system, user, budget = prompts.reflector_prompt(
                    [d.text for d in gen0], sum(d.input_tokens for d in gen0))
                answer = await self.caller.ask(job.tenant, self._upstream_for(job),
                                               "consolidate", system, user, budget)
                date, observations = fmt.parse(answer)
                if observations:
                    text = fmt.render(date or fmt.date_line(gen0[0].created_at),
                                      fmt.fit(observations, budget * fmt.CHARS_PER_TOKEN))
                    method = "worker"
            except WorkerUnavailable as exc:
                log.info("worker: consolidation falls back to the extractive merge: %s", exc)
        if method == "extractive":
            text = fmt.merge([d.text for d in gen0], sum(d.input_tokens for d in gen0))
        sources = [SourceMessage(i, "", "", 0.0) for d in gen0 for i in d.source_ids]
        n_in = sum(d.output_tokens for d in gen0) + 1

        def save(conn: Connection) -> int | None:
            return dstore.save(conn, tenant=job.tenant, project=job.project,
                               session=job.session, text=text, sources=sources, generation=1,
                               method=method, input_tokens=n_in, archive=[d.id for d in gen0])

        if await asyncio.to_thread(self.memory.write_job,
                                   in_tenant(job.tenant, save)) is not None:
            metrics.record_distillation(method, 1)

    async def _fallback_now(self, job: jobs.Job, reason: str) -> bool:
        """Whether a distill job that cannot use the model goes extractive now
        (else it was rescheduled to try the model again)."""
        if reason.startswith("retry:"):
            if job.attempts + 1 < self.settings.worker_max_attempts:
                delay = self.settings.worker_retry_base_s * 2 ** job.attempts
                await self._retry(job, delay, reason)
                return False
            return True
        if reason.startswith("no credential") and self.settings.worker and \
                self.clock() - job.created_at < CREDENTIAL_WAIT_S:
            await self._retry(job, POLL_S * 6, reason, count=False)
            return False
        return True

    async def _curate(self, job: jobs.Job) -> None:
        def read(conn: Connection) -> tuple[list[dstore.Distillation], list[kstore.Entry]]:
            return (dstore.uncurated(conn, job.tenant, job.project),
                    kstore.entries(conn, job.tenant, job.project))

        logs, entries = await asyncio.to_thread(self.memory.read, in_tenant(job.tenant, read))
        if not logs:
            await self._finish(job, "done")
            return
        try:
            upstream = self._upstream_for(job)
            system, user = curator.curator_prompt(entries, [d.text for d in logs])
            answer = await self.caller.ask(job.tenant, upstream, "curate", system, user,
                                           curator.CURATOR_MAX_TOKENS)
            ops = curator.parse_ops(answer)
        except (WorkerUnavailable, ValueError) as exc:
            reason = str(exc)
            stale = self.clock() - job.created_at > CURATE_WAIT_S
            if reason.startswith("budget") and not stale:
                await self._retry(job, jobs.next_day(self.clock()) - self.clock(), reason,
                                  count=False)
            elif job.attempts + 1 < self.settings.worker_max_attempts and not stale:
                await self._retry(job, self.settings.worker_retry_base_s * 2 ** job.attempts,
                                  reason, count=not reason.startswith("no credential"))
            else:
                await self._finish(job, "failed", reason)
                metrics.record_worker_job("curate", "failed")
            return

        apply = partial(_apply_curation, job=job, ops=ops, logs=logs, instance=self.instance,
                        clock=self.clock)
        changed = await asyncio.to_thread(self.memory.write_job, in_tenant(job.tenant, apply))
        if changed is None:
            log.warning("worker: curate job %d: its lease ran out before the result was "
                        "saved; another instance runs it", job.id)
            return
        metrics.record_worker_job("curate", "done")
        self._wake.set()
        if changed and self.knowledge is not None:
            self.knowledge.changed(job.tenant, job.project)
            await _export(self.knowledge, job, self.vault.get(job.tenant, job.session,
                                                              job.project))

    def _upstream_for(self, job: jobs.Job) -> SessionUpstream:
        if not self.settings.worker:
            raise WorkerUnavailable("off: LORE_WORKER is off")
        upstream = self.vault.get(job.tenant, job.session, job.project)
        if upstream is None:
            raise WorkerUnavailable("no credential: the session's credential is not held "
                                    "(gateway restarted, or the session ended long ago)")
        return upstream

    async def _retry(self, job: jobs.Job, delay: float, reason: str, *, count: bool = True) -> None:
        now = self.clock()
        self._retry_at = min(self._retry_at or now + delay, now + delay)
        await asyncio.to_thread(self.memory.write_job, lambda c: jobs.retry(
            c, job.id, now + delay, now, reason, count, instance=self.instance))

    async def _finish(self, job: jobs.Job, state: str, error: str | None = None) -> None:
        await asyncio.to_thread(self.memory.write_job, lambda c: jobs.finish(
            c, job.id, state, self.clock(), error, instance=self.instance))

    # --- status ----------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """Worker facts for ``lore status``, the banner and doctor (blocks: a thread)."""
        facts = worker_settings(self.settings)
        facts.update(self.memory.read(lambda c: job_facts(c, self.settings, self.clock())))
        facts["tokens_in_since_start"] = self.caller.tokens_in
        facts["tokens_out_since_start"] = self.caller.tokens_out
        facts["sessions_with_credentials"] = len(self.vault)
        facts["instance"] = self.instance
        return facts


# What a distill job's save returns when the lease was lost (a row id is >= 1).
_LEASE_LOST = -1


def _apply_curation(conn: Connection, *, job: jobs.Job, ops: list[curator.Op],
                    logs: list[dstore.Distillation], instance: str,
                    clock: Callable[[], float]) -> int | None:
    """Save a curate job's result while its lease holds (None: it ran out)."""
    with conn:
        if not jobs.holds(conn, job.id, instance, clock()):
            return None
        changed = curator.apply_ops(conn, job.tenant, job.project, ops,
                                    f"session {job.session[:24]}")
        dstore.mark_curated(conn, [d.id for d in logs])
        jobs.finish(conn, job.id, "done", clock(), instance=instance)
        # A log saved while the model answered (another instance distilled it)
        # could not queue its own curate job: this one held the slot.
        if dstore.uncurated(conn, job.tenant, job.project):
            jobs.enqueue(conn, "curate", job.tenant, job.project, job.session, clock(),
                         owner=instance)
        return changed


async def _export(knowledge: KnowledgeService, job: jobs.Job,
                  lender: SessionUpstream | None) -> None:
    """Write the project's ``.lore.md`` and the pointer in its agent's file."""
    # The Codex backend's worker requests differ; its history is Responses'.
    family = (Family.RESPONSES if lender is None or lender.family == "codex"
              else Family(lender.family))
    try:
        await asyncio.to_thread(knowledge.export_now, job.tenant, job.project,
                                agents_file(family))
    except OSError as exc:
        log.warning("knowledge: could not export .lore.md: %s", exc)
