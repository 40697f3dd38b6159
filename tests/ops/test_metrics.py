"""`GET /metrics`: Prometheus text that prometheus-client parses, counters that move."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from lore_gateway.obs import metrics
from lore_gateway.testing import FakeUpstream


async def scrape(http: aiohttp.ClientSession, url: str) -> dict[tuple[str, frozenset[Any]], float]:
    async with http.get(f"{url}/metrics") as response:
        assert response.status == 200
        assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
        text = await response.text()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: dict[tuple[str, frozenset[Any]], float], name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


async def test_request_counters_and_histograms_move(
    gateway: Any, fake_upstream: FakeUpstream, http: aiohttp.ClientSession
):
    before = await scrape(http, gateway.url)

    body = {"model": "gpt-fake", "input": "hi", "stream": True}
    for _ in range(2):
        async with http.post(f"{gateway.url}/v1/responses", json=body,
                             headers={"authorization": "Bearer sk-test-metrics-0123456789"}) as r:
            assert r.status == 200
            await r.read()
    async with http.get(f"{gateway.url}/no/such/route") as r:
        assert r.status == 404

    after = await scrape(http, gateway.url)
    ok = {"route": "/v1/responses", "status": "200", "protocol": "responses"}
    assert (value(after, "lore_requests_total", **ok)
            - value(before, "lore_requests_total", **ok)) == 2
    missing = {"route": "unmatched", "status": "404", "protocol": "none"}
    assert (value(after, "lore_requests_total", **missing)
            - value(before, "lore_requests_total", **missing)) == 1
    for histogram in ("lore_gateway_overhead_seconds_count", "lore_upstream_ttfb_seconds_count"):
        moved = value(after, histogram, protocol="responses") - value(
            before, histogram, protocol="responses")
        assert moved == 2, histogram


async def test_recording_functions_feed_the_exposition(gateway: Any, http: aiohttp.ClientSession):
    # Earlier tests' turns may still be on their way to storage; their count must
    # not land between the two scrapes.
    await asyncio.to_thread(gateway.memory.flush, 60)
    before = await scrape(http, gateway.url)

    metrics.record_recall("anthropic", results=3, latency_s=0.004)
    metrics.record_followup("anthropic")
    metrics.record_followup_failure("anthropic", "follow_up_transport")
    metrics.record_empty_completion("chat")
    metrics.record_stored_turns(2)
    metrics.record_usage("anthropic", input_tokens=1000, cache_read_tokens=900)
    metrics.set_queue_depth_source(lambda: 7)
    try:
        after = await scrape(http, gateway.url)
    finally:
        metrics.set_queue_depth_source(None)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("lore_recall_calls_total", protocol="anthropic", outcome="ok") == 1
    assert delta("lore_recall_results_total", protocol="anthropic") == 3
    assert delta("lore_recall_latency_seconds_count", protocol="anthropic") == 1
    assert delta("lore_followups_total", protocol="anthropic") == 1
    assert delta("lore_followup_failures_total", protocol="anthropic",
                 category="follow_up_transport") == 1
    assert delta("lore_empty_completions_total", protocol="chat") == 1
    assert delta("lore_stored_turns_total") == 2
    assert delta("lore_prompt_input_tokens_total", protocol="anthropic") == 1000
    assert delta("lore_prompt_cache_read_tokens_total", protocol="anthropic") == 900
    assert 0 < value(after, "lore_prompt_cache_read_ratio", protocol="anthropic") <= 1
    assert value(after, "lore_storage_queue_depth") == 7


def test_recording_never_raises_and_bounds_label_values():
    metrics.record_request("r", 200, "p", float("nan"), None)
    metrics.set_queue_depth_source(lambda: 1 // 0)
    try:
        body, _ = metrics.render()  # a failing source reads as 0, not an error
        assert b"lore_storage_queue_depth 0.0" in body
    finally:
        metrics.set_queue_depth_source(None)
    for i in range(metrics.MAX_LABEL_VALUES * 2):
        metrics.record_followup_failure("responses", f"made-up-category-{i}")
    body, _ = metrics.render()
    categories = {
        sample.labels["category"]
        for family in text_string_to_metric_families(body.decode())
        if family.name == "lore_followup_failures"
        for sample in family.samples
    }
    made_up = {c for c in categories if c.startswith("made-up-category-")}
    assert len(made_up) <= metrics.MAX_LABEL_VALUES
    assert metrics.OTHER in categories
    # The gateway's own categories are never folded away by traffic.
    metrics.record_followup_failure("responses", "follow_up_failed")
    body, _ = metrics.render()
    assert b'category="follow_up_failed"' in body
