"""Every recorded provider stream comes out of the gateway byte for byte.

The fake replays each file under ``shared/fixtures`` (``*.sse`` as is, in 1 KiB
slices so frames straddle reads; ``*.chunks.jsonl`` wrapped as ``event:`` +
``data:`` frames) and a raw HTTP client compares what the gateway relayed with
what the fake sent. No client-side decoding is involved, so any byte the
gateway adds, drops or reorders fails the test.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp

from lore_gateway.testing.fake_wire import replay_bytes


def route_for(fixture: Path) -> tuple[str, dict[str, Any]]:
    """The gateway path a client of this provider would call, and a minimal body."""
    top = fixture.parts[fixture.parts.index("fixtures") + 1]
    if top == "chat-completions":
        return "/v1/chat/completions", {"model": "m", "messages": [], "stream": True}
    if top in ("anthropic", "claude-code"):
        body = {"model": "m", "max_tokens": 8, "messages": [], "stream": True}
        return "/v1/messages?beta=true", body
    body = {"model": "m", "input": "hi", "stream": True}
    if top == "codex":
        return "/backend-api/codex/responses", body
    return "/v1/responses", body


async def test_recorded_stream_is_relayed_byte_identical(
    recorded_stream: Path, gateway: Any, http: aiohttp.ClientSession
) -> None:
    path, body = route_for(recorded_stream)
    headers = {"x-fake-replay": str(recorded_stream), "authorization": "Bearer sk-test"}
    async with http.post(gateway.url + path, json=body, headers=headers) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/event-stream")
        received = await response.read()
    assert received == replay_bytes(recorded_stream)


async def test_codex_fixture_without_final_newline_keeps_its_exact_end(
    gateway: Any, http: aiohttp.ClientSession, fixtures_dir: Path
) -> None:
    fixture = fixtures_dir / "codex/upstream-minimal/cli_responses_fixture.sse"
    assert not fixture.read_bytes().endswith(b"\n\n")  # the point of this test
    headers = {"x-fake-replay": str(fixture)}
    body = {"model": "m", "input": "hi", "stream": True}
    async with http.post(gateway.url + "/v1/responses", json=body, headers=headers) as response:
        received = await response.read()
    assert received == fixture.read_bytes()
