"""Prometheus metrics for ``GET /metrics``, on a registry of our own.

A dedicated ``CollectorRegistry`` (not prometheus-client's global one) keeps the
exposition to exactly what the gateway records, and lets an embedding process run
its own metrics beside ours without name clashes.

Every ``record_*`` function is O(1) and never raises: a metrics bug must not turn
into a failed request. Label values that come from traffic (route, protocol,
category) are bounded: after ``MAX_LABEL_VALUES`` distinct values per label the
rest are counted as ``"other"``, so a misbehaving client cannot grow the registry.

Prompt-cache read ratio: the counters ``lore_prompt_input_tokens_total`` (all
input tokens, cached ones included) and ``lore_prompt_cache_read_tokens_total``
give the ratio over any window in PromQL::

    rate(lore_prompt_cache_read_tokens_total[5m]) / rate(lore_prompt_input_tokens_total[5m])

``lore_prompt_cache_read_ratio`` is the same ratio since the gateway started, for
people reading ``/metrics`` by eye.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

log = logging.getLogger(__name__)

REGISTRY = CollectorRegistry(auto_describe=True)

# Distinct values kept per traffic-derived label before folding into "other".
MAX_LABEL_VALUES = 64
OTHER = "other"

# Gateway overhead is the time we add on top of upstream: parsing, routing, the
# SSE tap. The target is well under 5 ms, so most buckets live there.
OVERHEAD_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.00075, 0.001, 0.0015, 0.002, 0.003, 0.004, 0.005,
    0.0075, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
)
# Upstream time to first byte: model latency, from ~100 ms to long reasoning waits.
TTFB_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)
# Recall runs a local search: BM25 plus optional embeddings.
RECALL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)

requests_total = Counter(
    "lore_requests",
    "Requests handled, by route, HTTP status and protocol.",
    ["route", "status", "protocol"],
    registry=REGISTRY,
)
gateway_overhead_seconds = Histogram(
    "lore_gateway_overhead_seconds",
    "Time the gateway spent on a request, excluding the wait for upstream.",
    ["protocol"],
    buckets=OVERHEAD_BUCKETS,
    registry=REGISTRY,
)
upstream_ttfb_seconds = Histogram(
    "lore_upstream_ttfb_seconds",
    "Time from sending the request upstream to its first response byte.",
    ["protocol"],
    buckets=TTFB_BUCKETS,
    registry=REGISTRY,
)
recall_calls_total = Counter(
    "lore_recall_calls",
    "recall tool calls executed by the gateway, by protocol and outcome (ok/error).",
    ["protocol", "outcome"],
    registry=REGISTRY,
)
recall_results_total = Counter(
    "lore_recall_results",
    "Results returned to the model by recall calls.",
    ["protocol"],
    registry=REGISTRY,
)
recall_latency_seconds = Histogram(
    "lore_recall_latency_seconds",
    "Time to execute one recall call (search and formatting).",
    ["protocol"],
    buckets=RECALL_BUCKETS,
    registry=REGISTRY,
)
followups_total = Counter(
    "lore_followups",
    "Follow-up upstream requests sent after a recall call.",
    ["protocol"],
    registry=REGISTRY,
)
followup_failures_total = Counter(
    "lore_followup_failures",
    "Failed recall continuations, by failure category (lore-spec C.7).",
    ["protocol", "category"],
    registry=REGISTRY,
)
empty_completions_total = Counter(
    "lore_empty_completions",
    "Completions delivered to the client with no text, tool call or thinking.",
    ["protocol"],
    registry=REGISTRY,
)
stored_turns_total = Counter(
    "lore_stored_turns",
    "Turns committed to the memory database.",
    registry=REGISTRY,
)
storage_queue_depth = Gauge(
    "lore_storage_queue_depth",
    "Turns waiting in the memory writer's queue.",
    registry=REGISTRY,
)
prompt_input_tokens_total = Counter(
    "lore_prompt_input_tokens",
    "Input tokens reported by upstream usage, cached tokens included.",
    ["protocol"],
    registry=REGISTRY,
)
prompt_cache_read_tokens_total = Counter(
    "lore_prompt_cache_read_tokens",
    "Input tokens upstream reported as read from its prompt cache.",
    ["protocol"],
    registry=REGISTRY,
)
output_tokens_total = Counter(
    "lore_output_tokens",
    "Output tokens reported by upstream usage.",
    ["protocol"],
    registry=REGISTRY,
)
recall_hits_total = Counter(
    "lore_recall_hits",
    "recall calls that returned at least one result.",
    ["protocol"],
    registry=REGISTRY,
)
prompt_cache_read_ratio = Gauge(
    "lore_prompt_cache_read_ratio",
    "cache_read / input tokens since start, per protocol (see module docs for PromQL).",
    ["protocol"],
    registry=REGISTRY,
)
worker_jobs_total = Counter(
    "lore_worker_jobs",
    "Background jobs finished, by kind (distill, curate) and outcome.",
    ["kind", "outcome"],
    registry=REGISTRY,
)
worker_requests_total = Counter(
    "lore_worker_requests",
    "Background model requests, by job kind and result (ok, error, timeout).",
    ["kind", "result"],
    registry=REGISTRY,
)
worker_tokens_total = Counter(
    "lore_worker_tokens",
    "Tokens spent by background model requests, by direction (in, out).",
    ["direction"],
    registry=REGISTRY,
)
worker_budget_left_tokens = Gauge(
    "lore_worker_budget_left_tokens",
    "Worker tokens left today for the tenant charged last.",
    registry=REGISTRY,
)
distillations_total = Counter(
    "lore_distillations",
    "Distillations stored, by method (worker, extractive) and generation.",
    ["method", "generation"],
    registry=REGISTRY,
)
knowledge_injections_total = Counter(
    "lore_knowledge_injections",
    "Knowledge given to sessions: a frozen block at a session's start (block) or a "
    "mid-session message (update).",
    ["kind"],
    registry=REGISTRY,
)
compactions_total = Counter(
    "lore_compactions",
    "Agent compaction requests by flow (claude_summary, codex_local, codex_trigger, "
    "codex_compact) and outcome (answered from memory, passthrough without memory).",
    ["flow", "outcome"],
    registry=REGISTRY,
)
context_rewrites_total = Counter(
    "lore_context_rewrites",
    "Rewrites of a session's upstream context (issue 13), by reason: budget (the "
    "estimate passed the budget while warm: self-caused), cold (the provider cache had "
    "expired), overflow (after a context-length error), client_changed (the client "
    "replaced its history), emergency; prefix: rendered (the distilled prefix was "
    "re-rendered) or kept (only the raw tail's boundary moved).",
    ["reason", "prefix"],
    registry=REGISTRY,
)
context_requests_total = Counter(
    "lore_context_managed_requests",
    "Requests sent with a managed (rewritten) context, by layer.",
    ["layer"],
    registry=REGISTRY,
)
context_overflows_total = Counter(
    "lore_context_overflows",
    "Context-length errors from the upstream that forced a higher layer and a retry.",
    registry=REGISTRY,
)

_lock = threading.Lock()
_seen: dict[str, set[str]] = {}
_cache_totals: dict[str, tuple[int, int]] = {}
_queue_depth_source: Callable[[], int] | None = None


# Values the gateway itself produces are always kept; only unexpected ones (from
# traffic) count towards the cap, so a flood of odd routes cannot fold these away.
_KNOWN: dict[str, frozenset[str]] = {
    "route": frozenset({"local_recall"}),
    "protocol": frozenset({"responses", "codex", "chat", "anthropic", "gemini", "none"}),
    "category": frozenset({
        "recall_execution", "follow_up_setup", "follow_up_transport", "follow_up_protocol",
        "follow_up_failed", "follow_up_missing_output", "follow_up_incomplete_arguments",
        "follow_up_usage_missing", "parallel_recall", "nested_recall_incomplete",
        "nested_recall_execution", "depth_exhausted", "missing_recall_block",
        "resource_limit", "delivery", "unexpected",
    }),
}


# Each labelled child, looked up once: prometheus-client's ``labels()`` checks
# and converts its arguments and takes a lock on every call (about 1.4 us, and a
# model request records six). Bounded as the label values are (``_bounded``).
# A lost race only looks the same child up twice.
_children: dict[tuple[Any, ...], Any] = {}


def _child(metric: Any, *values: str) -> Any:
    key = (metric, *values)
    child = _children.get(key)
    if child is None:
        child = _children[key] = metric.labels(*values)
    return child


def _bounded(label: str, value: str) -> str:
    """``value``, or ``"other"`` once ``label`` already has MAX_LABEL_VALUES values."""
    if value in _KNOWN.get(label, ()):
        return value
    seen = _seen.setdefault(label, set())
    if value in seen:
        return value
    with _lock:
        if len(seen) >= MAX_LABEL_VALUES:
            return OTHER
        seen.add(value)
    return value


def record_request(
    route: str, status: int, protocol: str, overhead_s: float | None, ttfb_s: float | None
) -> None:
    """One finished request. ``overhead_s``/``ttfb_s`` are None when not measured
    (a 404 never reaches upstream)."""
    try:
        proto = _bounded("protocol", protocol or "none")
        _child(requests_total, _bounded("route", route), str(int(status)), proto).inc()
        if overhead_s is not None and overhead_s >= 0:
            _child(gateway_overhead_seconds, proto).observe(overhead_s)
        if ttfb_s is not None and ttfb_s >= 0:
            _child(upstream_ttfb_seconds, proto).observe(ttfb_s)
    except Exception:
        log.debug("metrics: record_request failed", exc_info=True)


def record_recall(protocol: str, results: int, latency_s: float, *, ok: bool = True) -> None:
    """One recall call executed by the gateway, and how many results it returned."""
    try:
        proto = _bounded("protocol", protocol)
        recall_calls_total.labels(proto, "ok" if ok else "error").inc()
        if results > 0:
            recall_results_total.labels(proto).inc(results)
            recall_hits_total.labels(proto).inc()
        if latency_s >= 0:
            recall_latency_seconds.labels(proto).observe(latency_s)
    except Exception:
        log.debug("metrics: record_recall failed", exc_info=True)


def record_followup(protocol: str) -> None:
    """A follow-up request sent upstream after a recall."""
    try:
        followups_total.labels(_bounded("protocol", protocol)).inc()
    except Exception:
        log.debug("metrics: record_followup failed", exc_info=True)


def record_followup_failure(protocol: str, category: str) -> None:
    """A recall continuation that failed; ``category`` is a lore-spec C.7 name."""
    try:
        followup_failures_total.labels(
            _bounded("protocol", protocol), _bounded("category", category)
        ).inc()
    except Exception:
        log.debug("metrics: record_followup_failure failed", exc_info=True)


def record_empty_completion(protocol: str) -> None:
    """An empty completion delivered to the client (lore-spec F.1)."""
    try:
        empty_completions_total.labels(_bounded("protocol", protocol)).inc()
    except Exception:
        log.debug("metrics: record_empty_completion failed", exc_info=True)


def record_stored_turns(count: int = 1) -> None:
    """Turns committed by the memory writer."""
    try:
        if count > 0:
            stored_turns_total.inc(count)
    except Exception:
        log.debug("metrics: record_stored_turns failed", exc_info=True)


def record_usage(protocol: str, input_tokens: int, cache_read_tokens: int,
                 output_tokens: int = 0) -> None:
    """Token and prompt-cache accounting from one upstream usage report.

    ``input_tokens`` must include the cached tokens. Providers differ: OpenAI's
    ``input_tokens`` already includes ``input_tokens_details.cached_tokens``, while
    Anthropic reports ``input_tokens`` *excluding* ``cache_read_input_tokens`` and
    ``cache_creation_input_tokens``, so the caller adds those first.
    """
    try:
        proto = _bounded("protocol", protocol)
        if output_tokens > 0:
            _child(output_tokens_total, proto).inc(output_tokens)
        if input_tokens <= 0:
            return
        cache_read = max(0, min(cache_read_tokens, input_tokens))
        _child(prompt_input_tokens_total, proto).inc(input_tokens)
        if cache_read:
            _child(prompt_cache_read_tokens_total, proto).inc(cache_read)
        with _lock:
            total_in, total_read = _cache_totals.get(proto, (0, 0))
            total_in += input_tokens
            total_read += cache_read
            _cache_totals[proto] = (total_in, total_read)
        _child(prompt_cache_read_ratio, proto).set(total_read / total_in)
    except Exception:
        log.debug("metrics: record_usage failed", exc_info=True)




def record_worker_job(kind: str, outcome: str) -> None:
    try:
        worker_jobs_total.labels(_bounded("kind", kind), _bounded("outcome", outcome)).inc()
    except Exception:
        log.exception("metrics: record_worker_job failed")


def record_worker_request(kind: str, result: str, tokens_in: int, tokens_out: int,
                          budget_left: int | None) -> None:
    try:
        worker_requests_total.labels(_bounded("kind", kind), _bounded("result", result)).inc()
        worker_tokens_total.labels("in").inc(max(0, tokens_in))
        worker_tokens_total.labels("out").inc(max(0, tokens_out))
        if budget_left is not None:
            worker_budget_left_tokens.set(max(0, budget_left))
    except Exception:
        log.exception("metrics: record_worker_request failed")


def record_knowledge(kind: str) -> None:
    try:
        knowledge_injections_total.labels(_bounded("kind", kind)).inc()
    except Exception:
        log.exception("metrics: record_knowledge failed")


def record_compaction(flow: str, outcome: str) -> None:
    try:
        compactions_total.labels(_bounded("flow", flow), _bounded("outcome", outcome)).inc()
    except Exception:
        log.exception("metrics: record_compaction failed")


def record_distillation(method: str, generation: int) -> None:
    try:
        distillations_total.labels(_bounded("method", method), str(min(generation, 9))).inc()
    except Exception:
        log.exception("metrics: record_distillation failed")


def set_queue_depth_source(source: Callable[[], int] | None) -> None:
    """Register the memory layer's queue-depth reader, read at scrape time.

    ``None`` unregisters it (on ``Memory.close``); the gauge then reads 0.
    """
    global _queue_depth_source
    _queue_depth_source = source
    storage_queue_depth.set_function(_read_queue_depth)


def _read_queue_depth() -> float:
    source = _queue_depth_source
    if source is None:
        return 0.0
    try:
        return float(source())
    except Exception:
        return 0.0


def render() -> tuple[bytes, str]:
    """The body and Content-Type for ``GET /metrics`` (Prometheus text format 0.0.4)."""
    return generate_latest(REGISTRY), CONTENT_TYPE_PLAIN_0_0_4


set_queue_depth_source(None)


def record_context_rewrite(reason: str, rendered: bool) -> None:
    try:
        context_rewrites_total.labels(_bounded("reason", reason),
                                      "rendered" if rendered else "kept").inc()
    except Exception:
        log.exception("metrics: record_context_rewrite failed")


def record_context_layer(layer: int) -> None:
    try:
        context_requests_total.labels(str(min(layer, 9))).inc()
    except Exception:
        log.exception("metrics: record_context_layer failed")


def record_context_overflow() -> None:
    try:
        context_overflows_total.inc()
    except Exception:
        log.exception("metrics: record_context_overflow failed")
