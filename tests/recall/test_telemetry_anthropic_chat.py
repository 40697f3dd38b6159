"""Empty-completion telemetry (lore-spec F.1) for Anthropic and Chat Completions,
through the gateway with recall injected: a whitespace-only answer logs one
warning with the exact fields and moves the metric; a sink that raises and a
sink that hangs change nothing the client receives, nor when it receives it."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

import aiohttp
import pytest
from responses_rig import wait_stored

from lore_gateway.obs import metrics
from lore_gateway.recall.core import telemetry
from lore_gateway.testing import FakeUpstream

SESSION = "telemetry-session-0123456789"
ANTHROPIC_TOOLS = [{"name": "exec", "description": "Run a command",
                    "input_schema": {"type": "object",
                                     "properties": {"cmd": {"type": "string"}}}}]
CHAT_TOOLS = [{"type": "function",
               "function": {"name": "exec", "parameters": {
                   "type": "object", "properties": {"cmd": {"type": "string"}}}}}]
# protocol → (path, model, stop reason the warning names)
SHAPES = {
    "anthropic": ("/v1/messages", "claude-fake", "end_turn"),
    "chat": ("/v1/chat/completions", "gpt-fake", "stop"),
}


def _request(protocol: str, stream: bool, scenario: str) -> tuple[str, dict[str, Any],
                                                                  dict[str, str]]:
    path, model, _ = SHAPES[protocol]
    headers = {"x-lore-session-id": SESSION, "x-fake-scenario": scenario}
    messages = [{"role": "user", "content": "Say nothing."}]
    if protocol == "anthropic":
        headers |= {"x-api-key": "sk-ant-telemetry-0123456789",
                    "anthropic-version": "2023-06-01"}
        body = {"model": model, "max_tokens": 64, "messages": messages,
                "tools": ANTHROPIC_TOOLS, "stream": stream}
    else:
        headers["authorization"] = "Bearer sk-telemetry-0123456789"
        body = {"model": model, "messages": messages, "tools": CHAT_TOOLS, "stream": stream}
    return path, body, headers


async def _send(http: aiohttp.ClientSession, gw: Any, protocol: str, stream: bool,
                scenario: str = "blank") -> tuple[int, bytes, float]:
    path, body, headers = _request(protocol, stream, scenario)
    started = time.monotonic()
    async with http.post(gw.url + path, json=body, headers=headers) as resp:
        status, data = resp.status, await resp.read()
    return status, data, time.monotonic() - started


def _count(protocol: str) -> float:
    value = metrics.REGISTRY.get_sample_value("lore_empty_completions_total",
                                              {"protocol": protocol})
    return value or 0.0


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "empty completion" in r.getMessage()]


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "json"])
@pytest.mark.parametrize("protocol", ["anthropic", "chat"])
async def test_blank_answer_warns_once_counts_and_bad_sinks_change_nothing(
    gateway: Any, fake_upstream: FakeUpstream, http: aiohttp.ClientSession,
    caplog: pytest.LogCaptureFixture, protocol: str, stream: bool,
) -> None:
    caplog.set_level(logging.WARNING, logger="lore.recall")
    # The same request with a well-behaved sink: what the client must get.
    reported = threading.Event()
    remove = telemetry.add_sink(lambda event: reported.set())
    try:
        status, expected, _ = await _send(http, gateway, protocol, stream)
        # Telemetry runs once the client has the answer: wait for this one's report.
        assert await asyncio.to_thread(reported.wait, 5)
    finally:
        remove()
    assert status == 200
    _, model, stop = SHAPES[protocol]
    assert len(_warnings(caplog)) == 1
    caplog.clear()
    fake_upstream.reset()

    release, got = threading.Event(), threading.Event()
    seen: list[telemetry.EmptyCompletion] = []

    def raising(event: telemetry.EmptyCompletion) -> None:
        raise RuntimeError("sink is broken")

    def hanging(event: telemetry.EmptyCompletion) -> None:
        seen.append(event)
        got.set()
        release.wait(30)

    before = _count(protocol)
    removers = [telemetry.add_sink(raising), telemetry.add_sink(hanging)]
    try:
        status, body, elapsed = await _send(http, gateway, protocol, stream)
        # The hanging sink holds the report while the response has long completed.
        assert await asyncio.to_thread(got.wait, 5)
    finally:
        release.set()
        for remove in removers:
            remove()

    assert status == 200 and elapsed < 5
    assert body == expected
    assert _count(protocol) - before == 1
    (warning,) = _warnings(caplog)
    assert warning.startswith(f"empty completion → client: protocol={protocol} model={model} "
                              f"stopReason={stop} outputTokens=")
    assert warning.endswith(f"recallDepth=0 session={SESSION[:16]}")
    assert SESSION not in warning
    (event,) = seen
    assert (event.protocol, event.model, event.stop_reason, event.recall_depth) == (
        protocol, model, stop, 0)
    if protocol == "chat" and stream:
        # A Chat stream without stream_options.include_usage reports no usage.
        assert event.output_tokens is None and "outputTokens=unknown " in warning
    else:
        assert isinstance(event.output_tokens, int)
        assert f"outputTokens={event.output_tokens} " in warning


@pytest.mark.parametrize("protocol", ["anthropic", "chat"])
async def test_an_answer_with_text_is_not_empty(
    gateway: Any, fake_upstream: FakeUpstream, http: aiohttp.ClientSession,
    caplog: pytest.LogCaptureFixture, protocol: str,
) -> None:
    caplog.set_level(logging.WARNING, logger="lore.recall")
    before = _count(protocol)
    turns = gateway.memory.count_turns(None, session=SESSION)
    status, body, _ = await _send(http, gateway, protocol, True, scenario="text")
    assert status == 200 and b"fake" in body
    # Telemetry is decided before the turn is handed to storage: once the turn is
    # stored, a warning that was going to fire has fired.
    await asyncio.to_thread(wait_stored, gateway, SESSION, turns + 1)
    assert _warnings(caplog) == [] and _count(protocol) == before
