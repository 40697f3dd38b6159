"""What a client sees through the gateway when the upstream misbehaves.

Each scenario of the fake has a test here. Where the right behaviour is "as if
the gateway were not there", the test compares the raw bytes (or SDK outcome)
through the gateway with those of a direct request.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import anthropic
import pytest

from lore_gateway.testing import FakeUpstream

SHAPES = {
    "responses": ("/v1/responses", {"model": "gpt-fake", "input": "hi", "stream": True}),
    "codex": ("/backend-api/codex/responses",
              {"model": "gpt-fake", "input": "hi", "stream": True}),
    "chat": ("/v1/chat/completions", {"model": "gpt-fake", "messages": [], "stream": True}),
    "anthropic": ("/v1/messages",
                  {"model": "claude-fake", "max_tokens": 8, "messages": [], "stream": True}),
}
# End-to-end response headers a client relies on (request ids, rate limits, retry).
RELAYED = ("retry-after", "x-request-id", "request-id", "x-ratelimit-limit-requests",
           "x-ratelimit-remaining-requests", "anthropic-ratelimit-requests-remaining",
           "x-codex-primary-used-percent", "x-codex-primary-window-minutes")


async def fetch(http: aiohttp.ClientSession, base: str, shape: str,
                scenario: str) -> tuple[int, dict[str, str], bytes]:
    path, body = SHAPES[shape]
    headers = {"x-fake-scenario": scenario, "authorization": "Bearer sk-test"}
    async with http.post(base + path, json=body, headers=headers) as response:
        kept = {k.lower(): v for k, v in response.headers.items() if k.lower() in RELAYED}
        return response.status, kept, await response.read()


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("status", [500, 429, 503])
async def test_upstream_error_status_body_and_headers_reach_the_client(
    shape: str, status: int, gateway: Any, fake_upstream: FakeUpstream,
    http: aiohttp.ClientSession,
) -> None:
    direct = await fetch(http, fake_upstream.url, shape, f"status-{status}")
    via = await fetch(http, gateway.url, shape, f"status-{status}")
    assert direct[0] == status and "retry-after" in direct[1]
    # x-request-id differs per request by design; everything else must match.
    assert (via[0], via[2]) == (direct[0], direct[2])
    assert {k for k in via[1]} == {k for k in direct[1]}
    assert {k: v for k, v in via[1].items() if "request-id" not in k} == {
        k: v for k, v in direct[1].items() if "request-id" not in k}


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("scenario", ["malformed-event", "missing-terminal", "failed",
                                      "incomplete", "minimal"])
async def test_bent_streams_pass_through_unchanged(
    shape: str, scenario: str, gateway: Any, fake_upstream: FakeUpstream,
    http: aiohttp.ClientSession,
) -> None:
    """The gateway does not validate streams it merely relays: same bytes as direct."""
    direct = await fetch(http, fake_upstream.url, shape, scenario)
    via = await fetch(http, gateway.url, shape, scenario)
    assert direct[0] == 200
    assert (via[0], via[2]) == (direct[0], direct[2])


BROKEN = b"the upstream connection broke mid-response"


@pytest.mark.parametrize("shape", SHAPES)
async def test_reset_between_events_ends_with_one_error_event(
    shape: str, gateway: Any, fake_upstream: FakeUpstream, http: aiohttp.ClientSession,
) -> None:
    """Frames sent before the reset arrive unchanged, then one protocol error event."""
    _, _, complete = await fetch(http, fake_upstream.url, shape, "text")
    status, _, received = await fetch(http, gateway.url, shape, "reset-mid-stream:2")
    assert status == 200
    frames = received.split(b"\n\n")
    assert received.endswith(b"\n\n") and len(frames) == 4  # 2 relayed, 1 error, ""
    assert complete.startswith(b"\n\n".join(frames[:2]) + b"\n\n")
    assert BROKEN in frames[2] and b"error" in frames[2]


@pytest.mark.parametrize("shape", SHAPES)
async def test_reset_inside_an_event_aborts_the_client_stream(
    shape: str, gateway: Any, http: aiohttp.ClientSession,
) -> None:
    """A half event cannot be completed honestly: the client's stream breaks too."""
    path, body = SHAPES[shape]
    headers = {"x-fake-scenario": "reset-mid-event:2"}
    received = b""
    async with http.post(gateway.url + path, json=body, headers=headers) as response:
        assert response.status == 200
        with pytest.raises(aiohttp.ClientPayloadError):
            async for chunk in response.content.iter_any():
                received += chunk
    assert BROKEN not in received


def test_reset_mid_stream_as_the_openai_sdk_sees_it(
    openai_client: Any, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.script(["reset-mid-stream:3"])
    events = list(openai_client.responses.create(model="gpt-fake", input="hi", stream=True))
    assert [e.type for e in events] == ["response.created", "response.in_progress",
                                        "response.output_item.added", "response.failed"]
    assert BROKEN.decode() in events[-1].response.error.message


def test_reset_mid_stream_makes_the_anthropic_sdk_raise(
    anthropic_client: Any, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.script(["reset-mid-stream:3"])
    with pytest.raises(anthropic.APIStatusError, match="broke mid-response"), \
            anthropic_client.messages.stream(model="claude-fake", max_tokens=8,
                                             messages=[{"role": "user", "content": "hi"}]) as s:
        s.get_final_message()


async def test_client_disconnect_during_stall_closes_upstream_promptly(
    gateway: Any, fake_upstream: FakeUpstream, http: aiohttp.ClientSession
) -> None:
    path, body = SHAPES["responses"]
    response = await http.post(gateway.url + path, json=body,
                               headers={"x-fake-scenario": "stall"})
    await response.content.readuntil(b"\n\n")  # the stream has started
    (record,) = fake_upstream.model_requests
    assert not record.client_gone.is_set()
    left_at = time.monotonic()
    response.close()
    assert await asyncio.to_thread(record.client_gone.wait, 5.0)
    assert record.client_gone_at is not None
    assert record.client_gone_at - left_at < 1.0


async def test_a_short_stall_still_delivers_the_whole_answer(
    gateway: Any, fake_upstream: FakeUpstream, http: aiohttp.ClientSession
) -> None:
    direct = await fetch(http, fake_upstream.url, "anthropic", "stall:0.3")
    via = await fetch(http, gateway.url, "anthropic", "stall:0.3")
    assert via[2] == direct[2] and b"message_stop" in via[2]
