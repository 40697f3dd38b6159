"""Issue 4 acceptance, through the real gateway and the fake upstream on loopback:
hidden recall on ``/v1/responses`` and ``/backend-api/codex/responses``."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from responses_rig import TOOLS, client, seed_fact

from lore_gateway.testing import FakeUpstream
from lore_gateway.testing.fake_wire import replay_bytes

FIXTURES = Path(__file__).resolve().parents[2].parent / "shared" / "fixtures"
# The one recorded stream that calls ``recall`` itself: the gateway intercepts it.
RECALL_FIXTURE = "recall_function_call__codex_replies_unsupported_call.sse"
RATE_LIMITS_FIRST = "text_with_codex_rate_limits_first_accepted.sse"
QUERY = "recall:staging database password rotation"


def responses_fixtures() -> list[Path]:
    found = [
        *FIXTURES.glob("openai-responses/*.chunks.jsonl"),
        *FIXTURES.glob("codex/**/*.sse"),
    ]
    return sorted(p for p in found if p.name != RECALL_FIXTURE)


def _appended_pair(first: dict[str, Any], follow: dict[str, Any]) -> list[dict[str, Any]]:
    """The items the follow-up appended to the principal's input."""
    original = first["input"]
    if isinstance(original, str):
        original = [{"type": "message", "role": "user", "content": original}]
    assert follow["input"][: len(original)] == original
    return list(follow["input"][len(original):])


def test_sdk_stream_sees_one_answer_from_the_continuation(
    gateway: Any, fake_upstream: FakeUpstream
) -> None:
    seed_fact(gateway, "acc-stream-seed")
    fake_upstream.reset()
    sdk = client(gateway, "acc-stream", scenario=QUERY)
    with sdk.responses.stream(model="gpt-fake", input="When does the password rotate?",
                              tools=TOOLS) as stream:  # type: ignore[arg-type]
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert not any("function_call" in k for k in kinds)
    assert [o.type for o in final.output] == ["message", "message"]
    assert final.output_text.startswith("<!-- lore-recall:")
    assert "According to memory" in final.output_text
    first, follow = fake_upstream.model_requests
    assert first.json["stream"] is True and follow.json["stream"] is True
    appended = _appended_pair(first.json, follow.json)
    assert [i["type"] for i in appended] == ["function_call", "function_call_output"]
    assert appended[0]["name"] == "recall" and appended[0]["call_id"] == appended[1]["call_id"]
    assert "04:00 UTC" in appended[1]["output"]


def test_sdk_json_goes_upstream_stream_false_twice(
    gateway: Any, fake_upstream: FakeUpstream
) -> None:
    seed_fact(gateway, "acc-json-seed")
    fake_upstream.reset()
    sdk = client(gateway, "acc-json", scenario=QUERY)
    raw = sdk.responses.with_raw_response.create(
        model="gpt-fake", input="When does the password rotate?", tools=TOOLS  # type: ignore[arg-type]
    )
    assert raw.headers["x-lore-recall-invoked"] == "true"
    answer = raw.parse()
    assert not any(o.type == "function_call" for o in answer.output)
    assert "According to memory" in answer.output_text
    first, follow = fake_upstream.model_requests
    # The SDK leaves ``stream`` out (false); the gateway's follow-up spells it out.
    assert first.json.get("stream", False) is False and follow.json["stream"] is False
    kinds = [i["type"] for i in _appended_pair(first.json, follow.json)]
    assert kinds == ["function_call", "function_call_output"]


def test_codex_route_json_client_gets_json_from_two_streamed_requests(
    gateway: Any, fake_upstream: FakeUpstream
) -> None:
    seed_fact(gateway, "acc-codex-seed")
    fake_upstream.reset()
    sdk = client(gateway, "acc-codex", path="/backend-api/codex", scenario=QUERY)
    raw = sdk.responses.with_raw_response.create(
        model="gpt-fake", input="When does the password rotate?", tools=TOOLS  # type: ignore[arg-type]
    )
    assert raw.headers["content-type"].startswith("application/json")
    assert raw.headers["x-lore-recall-invoked"] == "true"
    answer = raw.parse()
    assert "According to memory" in answer.output_text
    requests = fake_upstream.model_requests
    assert [r.route for r in requests] == ["/backend-api/codex/responses"] * 2
    assert [r.json["stream"] for r in requests] == [True, True]


@pytest.mark.parametrize("fixture", responses_fixtures(), ids=lambda p: p.name)
async def test_recorded_stream_unchanged_with_recall_tool_injected(
    fixture: Path, gateway: Any, fake_upstream: FakeUpstream, http: aiohttp.ClientSession
) -> None:
    path = "/backend-api/codex/responses" if "codex" in fixture.parts else "/v1/responses"
    body = {"model": "m", "input": "hi", "stream": True, "tools": TOOLS}
    headers = {"x-fake-replay": str(fixture), "x-lore-session-id": "acc-replay",
               "authorization": "Bearer sk-test"}
    async with http.post(gateway.url + path, json=body, headers=headers) as response:
        assert response.status == 200
        received = await response.read()
    sent = fake_upstream.model_requests[-1].json
    assert [t["name"] for t in sent["tools"]] == ["exec", "recall"]  # injected, not called
    expected = replay_bytes(fixture)
    if fixture.name == RATE_LIMITS_FIRST:
        # The documented exception: a rate-limit frame before response.created
        # moves to just after it, byte-identical.
        limits, rest = expected.split(b"\n\n", 1)
        created, tail = rest.split(b"\n\n", 1)
        assert limits.startswith(b"event: codex.rate_limits")
        expected = created + b"\n\n" + limits + b"\n\n" + tail
    assert received == expected



async def test_events_before_a_recall_reach_the_client_live(
    gateway: Any, fake_upstream: FakeUpstream, http: aiohttp.ClientSession
) -> None:
    """With the tool injected, the stream is still relayed as it arrives: the first
    frames reach the client while the upstream is silent."""
    body = {"model": "m", "input": "hi", "stream": True, "tools": TOOLS}
    headers = {"x-fake-scenario": "stall:2", "x-lore-session-id": "acc-live"}
    async with http.post(gateway.url + "/v1/responses", json=body, headers=headers) as response:
        first = await asyncio.wait_for(response.content.readuntil(b"\n\n"), 1.0)
        assert first.startswith(b"event: response.created")
        rest = await response.read()
    assert rest.rstrip().endswith(b"}") and b"response.completed" in rest
