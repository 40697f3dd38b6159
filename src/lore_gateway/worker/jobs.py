"""The worker's durable job queue and daily token ledger (synchronous SQL).

Jobs are rows in ``worker_jobs`` so they survive a restart: ``queued`` until
due, ``done`` or ``failed`` after. At most one queued job per (kind, tenant,
session). The ledger counts worker tokens per tenant per UTC day.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from lore_gateway.storage.base import Connection

# Finished jobs kept for status and debugging; older ones are pruned.
KEEP_FINISHED_JOBS = 1_000


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
            now: float, delay: float = 0.0) -> bool:
    """Queue a job unless the same one is already queued; True if queued now."""
    conn.execute(
        "INSERT INTO worker_jobs(kind, tenant, project, session, state, attempts,"
        " next_at, created_at, updated_at) VALUES (?,?,?,?,'queued',0,?,?,?)"
        " ON CONFLICT DO NOTHING",
        (kind, tenant, project, session, now + delay, now, now))
    return conn.changes() > 0


def due(conn: Connection, now: float, limit: int = 8) -> list[Job]:
    rows: list[Any] = conn.execute(
        "SELECT id, kind, tenant, project, session, attempts, created_at FROM worker_jobs"
        " WHERE state = 'queued' AND next_at <= ? ORDER BY next_at, id LIMIT ?",
        (now, limit)).fetchall()
    return [Job(int(r[0]), str(r[1]), str(r[2]), str(r[3]), str(r[4]), int(r[5]),
                float(r[6])) for r in rows]


def finish(conn: Connection, job_id: int, state: str, now: float,
           error: str | None = None) -> None:
    conn.execute("UPDATE worker_jobs SET state = ?, last_error = ?, updated_at = ? WHERE id = ?",
                 (state, error, now, job_id))
    conn.execute("DELETE FROM worker_jobs WHERE state IN ('done', 'failed') AND id <= ("
                 "SELECT max(id) FROM worker_jobs) - ?", (KEEP_FINISHED_JOBS,))


def retry(conn: Connection, job_id: int, at: float, now: float, error: str,
          count_attempt: bool = True) -> None:
    conn.execute("UPDATE worker_jobs SET attempts = attempts + ?, next_at = ?, last_error = ?,"
                 " updated_at = ? WHERE id = ?", (int(count_attempt), at, error, now, job_id))


def counts(conn: Connection) -> dict[str, int]:
    out = {"queued": 0, "done": 0, "failed": 0}
    for state, n in conn.execute("SELECT state, count(*) FROM worker_jobs GROUP BY state"):
        out[str(state)] = int(n)
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
