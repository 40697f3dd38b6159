"""Gemini through the gateway on the wire: the bytes, storage, credentials.

Raw HTTP (no SDK between), so what is compared is exactly what a client reads:
a JSON answer, an ``alt=sse`` stream and a streamed JSON array, each the same
bytes through the gateway as straight from the fake; the turn stored once; the
API key (header or ``?key=``) and an OAuth bearer forwarded and never stored.
"""

from __future__ import annotations

import time
from typing import Any

import httpx2 as httpx
import orjson
import pytest

from lore_gateway.memory.store.sanitize import redact_credentials
from lore_gateway.protocols.gemini_stream import JsonArrayDecoder
from lore_gateway.testing import FakeUpstream

from .kit import GEMINI_KEY, MODEL

BODY = {"contents": [{"role": "user", "parts": [{"text": "where is the config loader?"}]}],
        "systemInstruction": {"parts": [{"text": "be brief"}]}}
BEARER = "ya29.SECRET-oauth-token-0123456789"
METHODS = {
    "json": ":generateContent",
    "sse": ":streamGenerateContent?alt=sse",
    "array": ":streamGenerateContent",
}


def post(base: str, kind: str, *, body: Any = BODY, headers: dict[str, str] | None = None,
         key_in_query: bool = False) -> httpx.Response:
    path = f"/v1beta/models/{MODEL}{METHODS[kind]}"
    auth = {"x-goog-api-key": GEMINI_KEY}
    if key_in_query:
        path += ("&" if "?" in path else "?") + f"key={GEMINI_KEY}"
        auth = {}
    with httpx.Client(timeout=30) as client:
        return client.post(base + path, content=orjson.dumps(body),
                           headers={"content-type": "application/json", **auth,
                                    **(headers or {})})


def stored(gw: Any, session: str) -> list[tuple[str, str, bool]]:
    deadline = time.monotonic() + 10
    while gw.memory.count_turns(None, session=session) == 0 and time.monotonic() < deadline:
        gw.memory.flush(timeout=10)
        time.sleep(0.01)
    gw.memory.flush(timeout=10)
    return [(m.role, m.content, m.complete) for m in gw.memory.session_messages(None, session)]


@pytest.mark.parametrize("kind", list(METHODS))
@pytest.mark.parametrize("key_in_query", [False, True], ids=["header-key", "query-key"])
def test_the_same_bytes_as_straight_from_the_fake(gateway: Any, fake_upstream: FakeUpstream,
                                                  kind: str, key_in_query: bool) -> None:
    direct = post(fake_upstream.url, kind, key_in_query=key_in_query)
    via = post(gateway.url, kind, key_in_query=key_in_query)
    assert (via.status_code, via.content) == (direct.status_code, direct.content) == (
        200, direct.content)
    assert via.headers["content-type"] == direct.headers["content-type"]
    first, second = fake_upstream.model_requests
    assert second.path == first.path and second.body == first.body
    if key_in_query:
        assert f"key={GEMINI_KEY}" in second.path
    else:
        assert second.headers["x-goog-api-key"] == GEMINI_KEY
    if kind == "array":
        decoder = JsonArrayDecoder()
        records = decoder.feed(via.content)
        decoder.close()
        assert len(records) > 1


@pytest.mark.parametrize("scenario", ["malformed-event", "missing-terminal", "failed",
                                      "status-429", "too-long"])
@pytest.mark.parametrize("kind", ["sse", "array"])
def test_misbehaviour_is_relayed_as_it_came(gateway: Any, fake_upstream: FakeUpstream,
                                            scenario: str, kind: str) -> None:
    headers = {"x-fake-scenario": scenario}
    direct = post(fake_upstream.url, kind, headers=headers)
    via = post(gateway.url, kind, headers=headers)
    assert (via.status_code, via.content) == (direct.status_code, direct.content)
    if scenario.startswith("status-"):
        assert via.headers["retry-after"] == "7"


def test_a_broken_stream_ends_with_the_apis_error_record(gateway: Any,
                                                          fake_upstream: FakeUpstream) -> None:
    via = post(gateway.url, "sse", headers={"x-fake-scenario": "reset-mid-stream"})
    frames = via.content.split(b"\r\n\r\n")
    error = orjson.loads(frames[-2].removeprefix(b"data: "))["error"]
    assert (error["code"], error["status"]) == (502, "UNAVAILABLE")
    assert "broke mid-response" in error["message"]


@pytest.mark.parametrize("kind", list(METHODS))
def test_each_turn_is_stored_once_without_its_credentials(
        make_gateway: Any, fake_upstream: FakeUpstream, kind: str) -> None:
    gw = make_gateway()
    session = f"gemini-{kind}"
    reply = post(gw.url, kind, key_in_query=kind == "array",
                 headers={"x-lore-session-id": session, "authorization": f"Bearer {BEARER}"})
    assert reply.status_code == 200
    (upstream,) = fake_upstream.model_requests
    assert upstream.headers["authorization"] == f"Bearer {BEARER}"
    assert stored(gw, session) == [("user", "where is the config loader?", True),
                                   ("assistant", fake_upstream.text, True)]
    assert gw.memory.count_turns(None, session=session) == 1
    files = [p.read_bytes() for p in gw.settings.data_dir.rglob("*") if p.is_file()]
    assert all(GEMINI_KEY.encode() not in data and BEARER.encode() not in data
               for data in files)


def test_a_function_call_is_stored_as_the_others_are(make_gateway: Any,
                                                     fake_upstream: FakeUpstream) -> None:
    gw = make_gateway()
    fake_upstream.script(['tool:read_file {"path": "a.py"}'])
    post(gw.url, "sse", headers={"x-lore-session-id": "gemini-call"})
    assert stored(gw, "gemini-call") == [
        ("user", "where is the config loader?", True),
        ("assistant", '[tool_call:read_file] {"path": "a.py"}', True)]


def test_a_request_of_the_wrong_shape_gets_the_apis_400(gateway: Any,
                                                        fake_upstream: FakeUpstream) -> None:
    reply = post(gateway.url, "json", body={"contents": [{"role": "user", "parts": "hi"}]})
    assert reply.status_code == 400
    assert reply.json()["error"]["status"] == "INVALID_ARGUMENT"
    assert not fake_upstream.model_requests


def test_a_key_in_a_url_is_redacted_wherever_it_is_shown() -> None:
    url = f"https://example.invalid/v1beta/models/m:generateContent?alt=sse&key={GEMINI_KEY}"
    shown = redact_credentials(f"Could not reach the upstream {url}: refused")
    assert GEMINI_KEY not in shown and "alt=sse&key=[redacted]" in shown
    assert GEMINI_KEY not in redact_credentials(f"the key is {GEMINI_KEY}.")


def test_an_unreachable_upstream_error_never_shows_the_key(make_gateway: Any) -> None:
    gw = make_gateway(upstream_gemini="http://127.0.0.1:9")
    reply = post(gw.url, "json", key_in_query=True)
    assert reply.status_code == 502
    assert GEMINI_KEY not in reply.text and "key=[redacted]" in reply.text
