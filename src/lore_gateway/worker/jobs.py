"""The worker's durable job queue and daily token ledger (synchronous SQL).

Jobs are rows in ``worker_jobs`` so they survive a restart: ``queued`` until
due, ``done`` or ``failed`` after. At most one queued job per (kind, tenant,
session). The ledger counts worker tokens per tenant per UTC day.

Several gateways may share one database (docs/storage.md, "Several instances"),
so a job is *leased* before it runs: :func:`claim` marks one due job as taken by
this instance until ``lease_until``, atomically (on Postgres the candidate row
is locked ``FOR UPDATE SKIP LOCKED``, so two instances claiming at once take
different jobs; on SQLite the write lock serialises claims). Each job has an
``owner``, the instance that queued it: that instance holds the session's
credential in memory, so the others leave its jobs alone for
:data:`ORPHAN_AFTER_S` past due and take them only when the owner is gone.
Finishing, retrying and saving a job's result check the lease
(:func:`holds`), so a job whose lease ran out and was claimed elsewhere is
never saved twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from lore_gateway.storage.base import Connection

# Finished jobs kept for status and debugging; older ones are pruned.
KEEP_FINISHED_JOBS = 1_000
# How long past due another instance leaves a job to its owner (the instance
# that queued it and holds the session's credential): several of the owner's
# poll intervals, so only a stopped or stuck owner loses its jobs.
ORPHAN_AFTER_S = 60.0


@dataclass(frozen=True, slots=True)
class Job:
    id: int
    kind: str
    tenant: str
    project: str
    session: str
    attempts: int
    created_at: float


def day_of(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%d")


def next_day(epoch: float) -> float:
    start = datetime.fromtimestamp(epoch, UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return (start + timedelta(days=1)).timestamp()


def enqueue(conn: Connection, kind: str, tenant: str, project: str, session: str,
            now: float, delay: float = 0.0, owner: str | None = None) -> bool:
    """Queue a job unless the same one is already queued; True if queued now.

    ``owner``: the instance queuing it, which holds the session's credential
    (None: any instance may take it at once). When the job is already queued
    and not running, ``owner`` adopts it: the session's latest traffic came
    through this instance (after a restart, or a load balancer's move), so
    its credential is the one to use.
    """
    conn.execute(
        "INSERT INTO worker_jobs(kind, tenant, project, session, state, attempts,"
        " next_at, created_at, updated_at, owner) VALUES (?,?,?,?,'queued',0,?,?,?,?)"
        " ON CONFLICT DO NOTHING",
        (kind, tenant, project, session, now + delay, now, now, owner))
    if conn.changes() > 0:
        return True
    if owner is not None:
        conn.execute("UPDATE worker_jobs SET owner = ? WHERE kind = ? AND tenant = ?"
                     " AND session = ? AND state = 'queued' AND leased_by IS NULL"
                     " AND (owner IS NULL OR owner != ?)", (owner, kind, tenant, session, owner))
    return False


def _row_lock(conn: Connection) -> str:
    """The lock clause of a claim's candidate query: Postgres locks the row and
    skips rows another instance holds; SQLite's write lock already serialises."""
    return " FOR UPDATE SKIP LOCKED" if conn.backend == "postgres" else ""


def claim(conn: Connection, instance: str, now: float, lease_s: float) -> Job | None:
    """Lease the next due job to ``instance`` until ``now + lease_s``; None when
    nothing is due for it. A job under a live lease is never returned, and one
    owned by another instance only once it is :data:`ORPHAN_AFTER_S` past due."""
    rows: list[Any] = conn.execute(
        "UPDATE worker_jobs SET leased_by = ?, lease_until = ?, updated_at = ? WHERE id = ("
        "SELECT id FROM worker_jobs WHERE state = 'queued' AND next_at <= ?"
        " AND (lease_until IS NULL OR lease_until < ?)"
        " AND (owner IS NULL OR owner = ? OR next_at <= ?)"
        " ORDER BY next_at, id LIMIT 1" + _row_lock(conn) + ")"
        " RETURNING id, kind, tenant, project, session, attempts, created_at",
        (instance, now + lease_s, now, now, now, instance, now - ORPHAN_AFTER_S)).fetchall()
    if not rows:
        return None
    r = rows[0]
    return Job(int(r[0]), str(r[1]), str(r[2]), str(r[3]), str(r[4]), int(r[5]), float(r[6]))


def holds(conn: Connection, job_id: int, instance: str, now: float) -> bool:
    """Whether ``instance`` still holds the lease on a queued job. Inside the
    transaction that saves the job's result this also locks the row (Postgres),
    so a result is saved by one instance only."""
    conn.execute("UPDATE worker_jobs SET updated_at = ? WHERE id = ? AND state = 'queued'"
                 " AND leased_by = ? AND lease_until >= ?", (now, job_id, instance, now))
    return conn.changes() > 0


def renew(conn: Connection, job_id: int, instance: str, until: float) -> bool:
    """Extend a running job's lease; False when ``instance`` no longer holds it."""
    conn.execute("UPDATE worker_jobs SET lease_until = ? WHERE id = ? AND state = 'queued'"
                 " AND leased_by = ?", (until, job_id, instance))
    return conn.changes() > 0


def release(conn: Connection, instance: str) -> int:
    """Give up every lease of ``instance`` (it is stopping): its unfinished jobs
    are at once free for the next instance, rather than after the lease."""
    conn.execute("UPDATE worker_jobs SET leased_by = NULL, lease_until = NULL"
                 " WHERE leased_by = ? AND state = 'queued'", (instance,))
    return conn.changes()


def finish(conn: Connection, job_id: int, state: str, now: float,
           error: str | None = None, instance: str | None = None) -> bool:
    """End a job (``done`` or ``failed``); with ``instance``, only while it holds
    the lease. True when the job was ended here."""
    conn.execute("UPDATE worker_jobs SET state = ?, last_error = ?, updated_at = ?,"
                 " leased_by = NULL, lease_until = NULL WHERE id = ? AND state = 'queued'"
                 + _held_by(instance), (state, error, now, job_id, *_holder(instance)))
    ended = conn.changes() > 0
    conn.execute("DELETE FROM worker_jobs WHERE state IN ('done', 'failed') AND id <= ("
                 "SELECT max(id) FROM worker_jobs) - ?", (KEEP_FINISHED_JOBS,))
    return ended


def retry(conn: Connection, job_id: int, at: float, now: float, error: str,
          count_attempt: bool = True, instance: str | None = None) -> None:
    """Put a job back for ``at`` and release its lease (any instance may take it
    then, subject to ``owner``)."""
    conn.execute("UPDATE worker_jobs SET attempts = attempts + ?, next_at = ?, last_error = ?,"
                 " updated_at = ?, leased_by = NULL, lease_until = NULL WHERE id = ?"
                 + _held_by(instance),
                 (int(count_attempt), at, error, now, job_id, *_holder(instance)))


def _held_by(instance: str | None) -> str:
    return "" if instance is None else " AND leased_by = ?"


def _holder(instance: str | None) -> tuple[str, ...]:
    return () if instance is None else (instance,)


def counts(conn: Connection) -> dict[str, int]:
    """Jobs by state; ``running`` counts queued jobs under a lease (of any instance)."""
    out = {"queued": 0, "done": 0, "failed": 0, "running": 0}
    for state, n in conn.execute("SELECT state, count(*) FROM worker_jobs GROUP BY state"):
        out[str(state)] = int(n)
    row = conn.execute("SELECT count(*) FROM worker_jobs WHERE state = 'queued'"
                       " AND leased_by IS NOT NULL").fetchone()
    out["running"] = int(row[0]) if row else 0
    return out


def used(conn: Connection, tenant: str, now: float) -> int:
    row = conn.execute("SELECT tokens_in + tokens_out FROM worker_usage WHERE tenant = ? AND"
                       " day = ?", (tenant, day_of(now))).fetchone()
    return int(row[0]) if row else 0


def charge(conn: Connection, tenant: str, now: float, tokens_in: int,
           tokens_out: int) -> None:
    conn.execute(
        "INSERT INTO worker_usage(tenant, day, requests, tokens_in, tokens_out) VALUES"
        " (?,?,1,?,?) ON CONFLICT(tenant, day) DO UPDATE SET"
        " requests = worker_usage.requests + 1,"
        " tokens_in = worker_usage.tokens_in + excluded.tokens_in,"
        " tokens_out = worker_usage.tokens_out + excluded.tokens_out",
        (tenant, day_of(now), tokens_in, tokens_out))


def usage_today(conn: Connection, now: float) -> dict[str, dict[str, int]]:
    return {str(t): {"requests": int(r), "tokens_in": int(i), "tokens_out": int(o)}
            for t, r, i, o in conn.execute(
                "SELECT tenant, requests, tokens_in, tokens_out FROM worker_usage WHERE day = ?",
                (day_of(now),))}
