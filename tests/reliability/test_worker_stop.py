"""The background worker stops when told to, even when a turn wakes it at the
same moment: on Python 3.11 ``asyncio.wait_for`` loses a cancel that arrives as
the awaited event is set (CPython gh-86296), and a worker sleeping in it then
runs on forever, and the gateway's stop with it (issue 34's CI failure)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson

from lore_gateway.routing import match
from lore_gateway.server import Gateway
from lore_gateway.testing import ANTHROPIC_KEY, BackgroundServer, FakeUpstream
from lore_gateway.testing.gateway import gateway_settings

BODY = orjson.dumps({
    "model": "claude-test", "max_tokens": 64, "system": "You are a coding agent.",
    "tools": [{"name": "bash", "description": "Run a shell command.",
               "input_schema": {"type": "object", "properties": {}}}],
    "messages": [{"role": "user", "content": "List the handlers."}]})
HEADERS = [(b"content-type", b"application/json"), (b"x-api-key", ANTHROPIC_KEY.encode()),
           (b"anthropic-version", b"2023-06-01"), (b"x-lore-session-id", b"worker-stop"),
           (b"content-length", str(len(BODY)).encode())]


def test_the_worker_stops_when_a_turn_wakes_it_as_it_is_stopped(
        fake_upstream: FakeUpstream, tmp_path: Path) -> None:
    runner = BackgroundServer(Gateway(gateway_settings(fake_upstream, tmp_path, worker=True)))
    gw = runner.start()
    worker = gw.background.worker
    route = match("POST", "/v1/messages", "", anthropic_version=True, upgrade=False)
    assert route is not None

    async def wake_then_stop() -> bool:
        sent = False

        async def receive() -> dict[str, Any]:
            nonlocal sent
            body, sent = (b"" if sent else BODY), True
            return {"type": "http.request", "body": body, "more_body": False}

        scope = {"type": "http", "method": "POST", "path": route.upstream_path,
                 "headers": HEADERS}
        exchange, _ = await gw.proxy.prepare(scope, receive, route)
        assert exchange.coding
        worker.notify(exchange)  # the turn's response ended: the worker wakes...
        await asyncio.sleep(0)
        try:
            async with asyncio.timeout(10):  # ...as the gateway stops it
                await worker.stop()
        except TimeoutError:
            return False
        return True

    try:
        # On the gateway's own loop, where the worker's task runs.
        assert runner.call(wake_then_stop()), "the worker ignored its stop"
    finally:
        runner.stop()
