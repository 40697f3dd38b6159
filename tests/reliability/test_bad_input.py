"""Bad client input is a 4xx in the protocol's own error shape (issue 10, points 4, 6, 7).

Each case is one the campaign found: it gave a 500, a cut stream, reached the
wrong upstream path, or forwarded a shorter body than the client sent.
"""

from __future__ import annotations

import asyncio
import gzip
from typing import Any

import aiohttp
import orjson
import pytest
import zstandard

from lore_gateway.testing import FakeUpstream

CHAT = {"model": "gpt-x", "messages": [{"role": "user", "content": "hi"}]}
ANTHROPIC = {"model": "claude-x", "max_tokens": 10,
             "messages": [{"role": "user", "content": "hi"}]}
RESPONSES = {"model": "gpt-x", "input": "hi"}
TOOL = {"type": "function", "name": "read_file", "parameters": {"type": "object"}}
ANTHROPIC_TOOL = {"name": "read_file", "input_schema": {"type": "object"}}

WRONG_TYPES = [
    ("/v1/chat/completions", CHAT, "messages", 5),
    ("/v1/chat/completions", CHAT, "messages", True),
    ("/v1/chat/completions", CHAT, "messages", [1, 2]),
    ("/v1/chat/completions", CHAT, "tools", "read_file"),
    ("/v1/messages", ANTHROPIC, "messages", 5),
    ("/v1/messages", ANTHROPIC, "messages", False),
    ("/v1/messages", ANTHROPIC, "messages", [{"role": 3, "content": "x"}]),
    ("/v1/messages", ANTHROPIC, "tools", {"name": "x"}),
    ("/v1/messages", ANTHROPIC, "system", 7),
    ("/v1/responses", RESPONSES, "input", 5),
    ("/v1/responses", RESPONSES, "input", [3]),
    ("/v1/responses", RESPONSES, "tools", [1]),
    ("/backend-api/codex/responses", RESPONSES, "input", {"role": "user"}),
    # Found by the fuzz suite: a list where the handlers hash a string.
    ("/v1/responses", RESPONSES, "input", [{"role": "user", "type": []}]),
    ("/v1/chat/completions", CHAT, "tools", [{"type": "function", "function": 3}]),
]


async def post(http: aiohttp.ClientSession, url: str, body: bytes,
               headers: dict[str, str] | None = None) -> tuple[int, Any]:
    hdrs = {"content-type": "application/json", "authorization": "Bearer sk-bad-input-test",
            "x-api-key": "sk-ant-bad-input-test", "anthropic-version": "2023-06-01",
            **(headers or {})}
    async with http.post(url, data=body, headers=hdrs) as response:
        raw = await response.read()
        return response.status, orjson.loads(raw)


@pytest.mark.parametrize("path,base,field,value", WRONG_TYPES,
                         ids=[f"{p.rsplit('/', 1)[-1]}-{f}-{v!r}"[:60]
                              for p, _, f, v in WRONG_TYPES])
@pytest.mark.parametrize("with_tool", [False, True], ids=["plain", "tool"])
async def test_wrong_types_get_a_400_in_the_protocol_shape(
    gateway: Any, http: aiohttp.ClientSession, fake_upstream: FakeUpstream,
    path: str, base: dict[str, Any], field: str, value: Any, with_tool: bool,
) -> None:
    body = dict(base)
    if with_tool and field != "tools":
        body["tools"] = [ANTHROPIC_TOOL if path == "/v1/messages" else TOOL]
    body[field] = value
    for stream in (False, True):
        status, err = await post(http, gateway.url + path,
                                 orjson.dumps({**body, "stream": stream}))
        assert status == 400
        if path == "/v1/messages":
            assert err["type"] == "error"
            assert err["error"]["type"] == "invalid_request_error"
        else:
            assert err["error"]["type"] == "invalid_request_error"
            assert err["error"]["param"].startswith(field)
        assert field in err["error"]["message"]
    assert fake_upstream.model_requests == []


def with_nested(body: dict[str, Any], depth: int) -> bytes:
    """``body`` plus an ``extra`` field nested ``depth`` arrays deep (built as text:
    orjson itself cannot encode it, which is the point)."""
    encoded = orjson.dumps({**body, "extra": None})
    return encoded.replace(b'"extra":null', b'"extra":' + b"[" * depth + b"]" * depth)


@pytest.mark.parametrize("path,base,tool", [
    ("/v1/chat/completions", CHAT, TOOL),
    ("/v1/messages", ANTHROPIC, ANTHROPIC_TOOL),
    ("/v1/responses", RESPONSES, TOOL),
])
async def test_json_deeper_than_the_encoder_allows_is_a_400_not_a_500(
    gateway: Any, http: aiohttp.ClientSession, fake_upstream: FakeUpstream,
    path: str, base: dict[str, Any], tool: dict[str, Any],
) -> None:
    status, err = await post(http, gateway.url + path,
                             with_nested({**base, "tools": [tool]}, 300))
    assert status == 400
    assert "nested deeper" in err["error"]["message"]
    # 200 levels is still fine, and is forwarded.
    ok = with_nested({**base, "tools": [tool]}, 200)
    async with http.post(gateway.url + path, data=ok, headers={
            "content-type": "application/json", "authorization": "Bearer sk-x",
            "anthropic-version": "2023-06-01"}) as response:
        assert response.status == 200
        await response.read()


async def raw_request(gateway: Any, request: bytes) -> bytes:
    host, port = gateway.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(request)
    await writer.drain()
    data = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    return data


@pytest.mark.parametrize("target", [
    "/v1/../../etc/passwd",
    "/v1/%2e%2e/%2e%2e/etc/passwd",
    "/v1/%2E%2E/secret",
    "/v1/models/..",
    "/v1/./models",
    "/v1/models%2f..%2f..%2fadmin",
    "/v1/a%5c..%5cb",
    "/v1/%252e%252e/x",
])
async def test_dot_segments_are_refused_on_pass_through_routes(
    gateway: Any, fake_upstream: FakeUpstream, target: str,
) -> None:
    reply = await raw_request(gateway, (
        f"GET {target} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-path-test\r\n"
        "Connection: close\r\n\r\n").encode())
    assert reply.startswith(b"HTTP/1.1 400"), reply[:200]
    assert b"invalid_request_error" in reply
    assert fake_upstream.requests == []


async def test_an_escaped_question_mark_is_forwarded_as_written(
    gateway: Any, http: aiohttp.ClientSession, fake_upstream: FakeUpstream,
) -> None:
    reply = await raw_request(gateway, (
        b"GET /v1/models/a%3Fb?x=1 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"))
    assert reply.startswith(b"HTTP/1.1 ")
    (record,) = fake_upstream.requests
    assert record.path == "/v1/models/a%3Fb?x=1"


def zstd_frames(raw: bytes) -> bytes:
    half = len(raw) // 2
    return (zstandard.ZstdCompressor().compress(raw[:half])
            + zstandard.ZstdCompressor().compress(raw[half:]))


def gzip_members(raw: bytes) -> bytes:
    half = len(raw) // 2
    return gzip.compress(raw[:half]) + gzip.compress(raw[half:])


@pytest.mark.parametrize("encoding,pack", [("zstd", zstd_frames), ("gzip", gzip_members)])
async def test_every_frame_and_member_of_a_compressed_body_is_decoded(
    gateway: Any, http: aiohttp.ClientSession, fake_upstream: FakeUpstream,
    encoding: str, pack: Any,
) -> None:
    raw = orjson.dumps(RESPONSES)
    async with http.post(gateway.url + "/v1/responses", data=pack(raw), headers={
            "content-encoding": encoding, "content-type": "application/json",
            "authorization": "Bearer sk-x"}) as response:
        assert response.status == 200
        await response.read()
    (record,) = fake_upstream.model_requests
    assert record.json == RESPONSES


@pytest.mark.parametrize("path", ["/v1/responses", "/v1/models"])
@pytest.mark.parametrize("encoding,body", [
    ("gzip", b"this is not gzip at all"),
    ("gzip", gzip.compress(b'{"model": "gpt-x", "input": "hi"}')[:-6]),
    ("zstd", b"this is not zstd at all"),
    ("zstd", zstandard.ZstdCompressor().compress(b'{"model": "gpt-x", "input": "hi"}')[:-3]),
], ids=["gzip-garbage", "gzip-truncated", "zstd-garbage", "zstd-truncated"])
async def test_garbage_or_truncated_compressed_bodies_get_a_400(
    gateway: Any, http: aiohttp.ClientSession, fake_upstream: FakeUpstream,
    path: str, encoding: str, body: bytes,
) -> None:
    status, err = await post(http, gateway.url + path, body, {"content-encoding": encoding})
    assert status == 400
    assert f"not valid {encoding}" in err["error"]["message"]
    assert fake_upstream.requests == []
