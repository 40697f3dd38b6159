"""The overview's charts: the gateway's own metrics, sampled into the database.

Prometheus counters live in the process and start from zero at each start, so the
charts could not survive a restart if they read ``/metrics``. A sampler thread
reads the counters every ``LORE_UI_SAMPLE_SECONDS`` and, when anything moved,
stores the *increments* of that interval as one ``metrics_samples`` row (schema
v7) through the memory writer (the database keeps one writer). Rows older than
:data:`KEEP_SECONDS` are deleted as new ones arrive, so the table stays bounded.

``series`` turns the rows of a time window into a fixed number of buckets: what
the charts draw and what the live stream sends.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import astuple, dataclass, fields
from typing import Any

from lore_gateway.obs import metrics
from lore_gateway.storage.base import Connection
from lore_gateway.storage.dialect import table_exists

log = logging.getLogger("lore.ui")

# Samples kept: a month of history is what an overview is for; older rows go.
KEEP_SECONDS = 30 * 86400
# Points per chart: enough to see a shape, few enough to send on every update.
BUCKETS = 60
# Windows the overview offers, in seconds.
WINDOWS = {"15m": 900, "1h": 3600, "24h": 86400, "7d": 7 * 86400, "30d": 30 * 86400}


@dataclass(frozen=True, slots=True)
class Totals:
    """Counter values at one moment (or the increments between two moments)."""

    requests: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    cache_read: int = 0
    recall_calls: int = 0
    recall_hits: int = 0
    overhead_s: float = 0.0
    overhead_n: int = 0

    def minus(self, earlier: Totals) -> Totals:
        # A counter never decreases within a process; max() guards a reset anyway.
        return Totals(*(max(a - b, 0) for a, b in zip(astuple(self), astuple(earlier),
                                                       strict=True)))

    @property
    def empty(self) -> bool:
        return not any(astuple(self))


def _sum(metric: Any, suffix: str = "_total", where: Callable[[dict[str, str]], bool] | None
         = None) -> float:
    total = 0.0
    for family in metric.collect():
        for sample in family.samples:
            if sample.name.endswith(suffix) and (where is None or where(sample.labels)):
                total += float(sample.value)
    return total


def read_totals() -> Totals:
    """The gateway's counters now. Model requests only: they carry a protocol."""
    return Totals(
        requests=int(_sum(metrics.requests_total,
                          where=lambda labels: labels.get("protocol", "none") != "none")),
        tokens_in=int(_sum(metrics.prompt_input_tokens_total)),
        tokens_out=int(_sum(metrics.output_tokens_total)),
        cache_read=int(_sum(metrics.prompt_cache_read_tokens_total)),
        recall_calls=int(_sum(metrics.recall_calls_total)),
        recall_hits=int(_sum(metrics.recall_hits_total)),
        overhead_s=_sum(metrics.gateway_overhead_seconds, "_sum"),
        overhead_n=int(_sum(metrics.gateway_overhead_seconds, "_count")),
    )


_COLUMNS = tuple(f.name for f in fields(Totals))


def insert_sample(conn: Connection, ts: float, delta: Totals) -> None:
    """Store one interval's increments and drop rows past :data:`KEEP_SECONDS`."""
    marks = ",".join("?" * (len(_COLUMNS) + 1))
    with conn:
        conn.execute(f"INSERT INTO metrics_samples(ts, {', '.join(_COLUMNS)}) VALUES ({marks})",
                     (ts, *astuple(delta)))
        conn.execute("DELETE FROM metrics_samples WHERE ts < ?", (ts - KEEP_SECONDS,))


def series(conn: Connection, window_s: float, now: float | None = None,
           buckets: int = BUCKETS) -> dict[str, Any]:
    """The window's samples in ``buckets`` equal slots, oldest first, as chart data.

    Ratios (cache read share, recall hit rate, mean overhead) are computed per slot
    from the summed counts, so an empty slot is a gap (``None``), not a zero.
    """
    now = time.time() if now is None else now
    start = now - window_s
    width = window_s / buckets
    sums = [[0.0] * len(_COLUMNS) for _ in range(buckets)]
    for row in conn.execute(f"SELECT ts, {', '.join(_COLUMNS)} FROM metrics_samples"
                            " WHERE ts > ? AND ts <= ? ORDER BY ts", (start, now)):
        slot = min(int((float(row[0]) - start) / width), buckets - 1)
        for i, value in enumerate(row[1:]):
            sums[slot][i] += float(value)
    col = {name: i for i, name in enumerate(_COLUMNS)}

    def ratio(num: str, den: str, scale: float = 1.0) -> list[float | None]:
        return [round(s[col[num]] / s[col[den]] * scale, 4) if s[col[den]] else None
                for s in sums]

    total = [sum(s[i] for s in sums) for i in range(len(_COLUMNS))]
    t = {name: total[i] for name, i in col.items()}
    return {
        "t": [round(start + width * (i + 1)) for i in range(buckets)],
        "requests": [int(s[col["requests"]]) for s in sums],
        "tokens_in": [int(s[col["tokens_in"]]) for s in sums],
        "tokens_out": [int(s[col["tokens_out"]]) for s in sums],
        "cache_share": ratio("cache_read", "tokens_in", 100.0),
        "recall_calls": [int(s[col["recall_calls"]]) for s in sums],
        "recall_hit_rate": ratio("recall_hits", "recall_calls", 100.0),
        "overhead_ms": ratio("overhead_s", "overhead_n", 1000.0),
        "totals": {
            "requests": int(t["requests"]), "tokens_in": int(t["tokens_in"]),
            "tokens_out": int(t["tokens_out"]),
            "cache_share": round(100 * t["cache_read"] / t["tokens_in"], 1)
            if t["tokens_in"] else None,
            "recall_calls": int(t["recall_calls"]),
            "recall_hit_rate": round(100 * t["recall_hits"] / t["recall_calls"], 1)
            if t["recall_calls"] else None,
            "overhead_ms": round(1000 * t["overhead_s"] / t["overhead_n"], 3)
            if t["overhead_n"] else None,
        },
        "per_tenant": False,
    }


def series_for(conn: Connection, viewer_tenant: str | None, window_s: float) -> dict[str, Any]:
    """What a viewer's charts show: the gateway's own counters, or (a signed-in team
    member, ``viewer_tenant`` set) their own stored memory."""
    if viewer_tenant is None:
        return series(conn, window_s)
    return tenant_series(conn, viewer_tenant, window_s)


class Sampler:
    """A thread that stores the counters' increments every ``interval`` seconds.

    ``write(job)`` runs ``job(conn)`` on the memory writer. ``version`` changes each
    time a sample is stored; the live stream watches it instead of the database.
    ``close()`` stores the last increments and stops (before the memory closes).
    """

    def __init__(self, write: Callable[[Callable[[Connection], None]], None],
                 interval: float) -> None:
        self._write = write
        self._interval = interval
        self._last = read_totals()
        self._stop = threading.Event()
        self.version = 0
        self._thread = threading.Thread(target=self._run, name="lore-ui-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.sample()

    def sample(self) -> bool:
        """Store the increments since the last sample; ``True`` if there were any."""
        now = read_totals()
        delta = now.minus(self._last)
        if delta.empty:
            return False
        try:
            self._write(lambda conn: insert_sample(conn, time.time(), delta))
        except Exception as exc:  # the charts miss a point; the gateway goes on
            log.warning("ui: could not store a metrics sample: %s", exc)
            return False
        self._last = now
        self.version += 1
        return True

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.sample()


def tenant_series(conn: Connection, tenant: str, window_s: float, now: float | None = None,
                  buckets: int = BUCKETS) -> dict[str, Any]:
    """The same chart data for one tenant, from its stored memory (team mode).

    The gateway's counters are not kept per tenant, so a team member's charts come
    from their own turns: requests are stored turns, tokens are the stored
    messages' estimates (``ceil(chars / 3)``; user and tool input up, assistant
    output down), recalls are the recall log with a hit when a result came back.
    Cache reads and overhead are not stored per tenant: those slots stay empty.
    """
    now = time.time() if now is None else now
    start = now - window_s
    width = window_s / buckets
    requests, up, down, calls, hits = ([0] * buckets for _ in range(5))

    def slot(ts: float) -> int:
        return min(max(int((ts - start) / width), 0), buckets - 1)

    for ts, in conn.execute("SELECT created_at FROM turns WHERE tenant = ? AND created_at > ?"
                            " AND created_at <= ? AND protocol != 'lore-distill'",
                            (tenant, start, now)):
        requests[slot(float(ts))] += 1
    for ts, role, tokens in conn.execute(
            "SELECT created_at, role, tokens FROM messages WHERE tenant = ? AND created_at > ?"
            " AND created_at <= ? AND role != 'observations'", (tenant, start, now)):
        (down if role == "assistant" else up)[slot(float(ts))] += int(tokens)
    has_anchors = table_exists(conn, "recall_anchors")
    if has_anchors:
        for ts, result in conn.execute(
                "SELECT created_at, tool_result FROM recall_anchors WHERE tenant = ?"
                " AND created_at > ? AND created_at <= ?", (tenant, start, now)):
            calls[slot(float(ts))] += 1
            if b"t:" in (result if isinstance(result, bytes) else str(result).encode()):
                hits[slot(float(ts))] += 1
    empty: list[float | None] = [None] * buckets
    total_calls, total_hits = sum(calls), sum(hits)
    return {
        "t": [round(start + width * (i + 1)) for i in range(buckets)],
        "requests": requests, "tokens_in": up, "tokens_out": down,
        "cache_share": empty, "recall_calls": calls,
        "recall_hit_rate": [round(100 * h / c, 4) if c else None for h, c in zip(hits, calls,
                                                                              strict=True)],
        "overhead_ms": empty,
        "totals": {"requests": sum(requests), "tokens_in": sum(up), "tokens_out": sum(down),
                   "cache_share": None, "recall_calls": total_calls,
                   "recall_hit_rate": round(100 * total_hits / total_calls, 1)
                   if total_calls else None, "overhead_ms": None},
        "per_tenant": True,
    }
