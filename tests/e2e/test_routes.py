"""What a client sees from the gateway's own routes and its forwarding rules."""

from __future__ import annotations

import gzip
from typing import Any

import aiohttp
import orjson
import pytest
import zstandard

from lore_gateway import __version__
from lore_gateway.testing import FakeUpstream

RESPONSES_BODY = {"model": "gpt-fake", "input": "say hi", "stream": True}


async def test_head_root_and_health(gateway: Any, http: aiohttp.ClientSession) -> None:
    async with http.head(gateway.url + "/") as response:
        assert response.status == 200
    async with http.get(gateway.url + "/health") as response:
        assert response.status == 200
        assert orjson.loads(await response.read()) == {"status": "ok", "version": __version__}


async def test_the_root_page_leads_a_browser_to_the_memory_browser(
    gateway: Any, http: aiohttp.ClientSession
) -> None:
    async with http.get(gateway.url + "/", allow_redirects=False) as response:
        assert response.status == 302
        assert response.headers["location"] == "/ui"


async def test_unknown_route_is_404_with_the_route_named(
    gateway: Any, http: aiohttp.ClientSession, fake_upstream: FakeUpstream
) -> None:
    async with http.post(gateway.url + "/nope/here", json={}) as response:
        assert response.status == 404
        assert orjson.loads(await response.read()) == {
            "type": "error",
            "error": {"type": "not_found", "message": "No route for POST /nope/here"},
        }
    assert fake_upstream.requests == []


@pytest.mark.parametrize("path", ["/v1/responses", "/v1/chat/completions", "/v1/messages"])
async def test_invalid_json_is_400_and_never_reaches_upstream(
    path: str, gateway: Any, http: aiohttp.ClientSession, fake_upstream: FakeUpstream
) -> None:
    headers = {"content-type": "application/json"}
    async with http.post(gateway.url + path, data=b'{"model": ', headers=headers) as response:
        assert response.status == 400
        assert b"JSON" in await response.read()
    assert fake_upstream.requests == []


@pytest.mark.parametrize("path", ["/v1/responses", "/backend-api/codex/responses"])
async def test_websocket_upgrade_on_responses_is_426_and_closes(
    path: str, gateway: Any, http: aiohttp.ClientSession
) -> None:
    headers = {"Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "13",
               "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}
    async with http.get(gateway.url + path, headers=headers) as response:
        assert response.status == 426
        assert response.headers["Connection"].lower() == "close"
        assert "error" in orjson.loads(await response.read())


@pytest.mark.parametrize("encoding", ["zstd", "gzip"])
async def test_compressed_request_body_is_decoded(
    encoding: str, gateway: Any, http: aiohttp.ClientSession, fake_upstream: FakeUpstream
) -> None:
    raw = orjson.dumps(RESPONSES_BODY)
    packed = zstandard.ZstdCompressor().compress(raw) if encoding == "zstd" else gzip.compress(raw)
    headers = {"content-encoding": encoding, "content-type": "application/json",
               "authorization": "Bearer tok-test"}
    url = gateway.url + "/backend-api/codex/responses"
    async with http.post(url, data=packed, headers=headers) as response:
        assert response.status == 200
        assert b"response.completed" in await response.read()
    (record,) = fake_upstream.model_requests
    assert record.json == RESPONSES_BODY


@pytest.mark.parametrize("path", ["/backend-api/codex/responses", "/v1/codex/responses"])
async def test_codex_route_reaches_the_chatgpt_backend_with_headers(
    path: str, gateway: Any, http: aiohttp.ClientSession, fake_upstream: FakeUpstream
) -> None:
    headers = {"authorization": "Bearer tok-chatgpt", "chatgpt-account-id": "acct-fake-1234",
               "session-id": "0199-session", "originator": "codex_exec"}
    async with http.post(gateway.url + path, json=RESPONSES_BODY, headers=headers) as response:
        assert response.status == 200
        for name in ("x-codex-primary-used-percent", "x-codex-secondary-window-minutes",
                     "x-request-id", "x-ratelimit-remaining-requests"):
            assert name in response.headers, name
        await response.read()
    (record,) = fake_upstream.model_requests
    assert record.path == "/backend-api/codex/responses"
    for name, value in headers.items():
        assert record.headers[name] == value


async def test_codex_stream_false_is_answered_as_json_from_a_stream(
    gateway: Any, http: aiohttp.ClientSession, fake_upstream: FakeUpstream
) -> None:
    body = {"model": "gpt-fake", "input": "say hi", "stream": False, "store": False,
            "max_output_tokens": 100}
    async with http.post(gateway.url + "/backend-api/codex/responses", json=body) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("application/json")
        answer = orjson.loads(await response.read())
    assert answer["status"] == "completed"
    assert answer["output"][0]["content"][0]["text"] == fake_upstream.text
    (record,) = fake_upstream.model_requests
    assert record.json["stream"] is True and record.json["store"] is False
    assert "max_output_tokens" not in record.json


async def test_bare_chat_completions_path_is_routed(
    gateway: Any, http: aiohttp.ClientSession, fake_upstream: FakeUpstream
) -> None:
    body = {"model": "gpt-fake", "messages": [{"role": "user", "content": "hi"}]}
    async with http.post(gateway.url + "/chat/completions", json=body) as response:
        assert response.status == 200
        assert orjson.loads(await response.read())["object"] == "chat.completion"
    assert fake_upstream.model_requests[0].path == "/v1/chat/completions"


async def test_v1_passthrough_goes_to_anthropic_when_the_request_says_so(
    gateway: Any, http: aiohttp.ClientSession, fake_upstream: FakeUpstream
) -> None:
    headers = {"anthropic-version": "2023-06-01", "x-api-key": "sk-ant-test"}
    async with http.get(gateway.url + "/v1/models", headers=headers) as response:
        assert response.status == 200
        assert orjson.loads(await response.read())["data"][0]["id"] == "claude-fake"
    (record,) = fake_upstream.requests
    assert record.headers["x-api-key"] == "sk-ant-test"


async def test_unknown_request_fields_tools_and_roles_pass_untouched(
    gateway: Any, http: aiohttp.ClientSession, fake_upstream: FakeUpstream
) -> None:
    body = {
        "model": "claude-fake", "max_tokens": 8, "stream": True,
        "messages": [{"role": "user", "content": "hi"},
                     {"role": "system", "content": "mid-conversation system"}],
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "some_future_field": {"nested": [1, 2, 3]},
    }
    raw = orjson.dumps(body)
    headers = {"content-type": "application/json", "anthropic-version": "2023-06-01"}
    async with http.post(gateway.url + "/v1/messages?beta=true", data=raw,
                         headers=headers) as response:
        assert response.status == 200
        await response.read()
    (record,) = fake_upstream.model_requests
    assert record.path == "/v1/messages?beta=true"
    assert record.json == body
