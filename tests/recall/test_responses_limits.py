"""Live Responses recall limits and protocol errors (lore-spec E.1, E.2), as the
streaming client sees them through the gateway.

Each limit is a ``Settings`` field (``LORE_RECALL_STREAM_MAX_BYTES``,
``LORE_RECALL_RETAINED_MAX_BYTES``, ``LORE_RECALL_DEFERRED_MAX_BYTES``); the tests
set small values so the fake can cross them quickly. Whatever the error, the
client gets the events already sent plus exactly one ``response.failed``; the
exact reason goes to the log, never to the client.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from responses_rig import KEY, TOOLS, sse_events

from lore_gateway.config import Settings
from lore_gateway.testing import FakeUpstream
from lore_gateway.testing import fake_streams as fs

RECALL_FAILED = "Lore could not continue the response after recall"
GATEWAY_FAILED = "Gateway request failed"
KiB = 1024


@pytest.fixture(autouse=True)
def _log(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="lore.recall")


async def _stream(http: aiohttp.ClientSession, gw: Any, session: str) -> bytes:
    body = {"model": "gpt-fake", "input": "What do we know?", "stream": True, "tools": TOOLS}
    headers = {"authorization": f"Bearer {KEY}", "x-lore-session-id": session}
    async with http.post(gw.url + "/v1/responses", json=body, headers=headers) as resp:
        assert resp.status == 200
        return await resp.read()


def _one_failure(body: bytes, message: str, reason: str | None = None) -> list[str]:
    """One ``response.failed``: the spec's ``message``, then ``: reason`` when the
    upstream itself failed (issue 15: the client is told why)."""
    events = sse_events(body)
    names = [n for n, _ in events]
    assert names.count("response.created") == 1
    assert names[-1] == "response.failed" and names.count("response.failed") == 1
    response = events[-1][1]["response"]
    text = response["error"]["message"]
    if reason is None:
        assert text == message
    else:
        assert text.startswith(message + ": ") and reason in text, text
    assert response["id"] == events[0][1]["response"]["id"]
    return names


def test_limits_are_settings_with_the_spec_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    defaults = Settings()
    assert (defaults.recall_stream_max_bytes, defaults.recall_retained_max_bytes,
            defaults.recall_deferred_max_bytes) == (64 << 20, 16 << 20, 1 << 20)
    monkeypatch.setenv("LORE_RECALL_DEFERRED_MAX_BYTES", "4096")
    assert Settings().recall_deferred_max_bytes == 4096


async def test_stream_byte_limit(make_gateway: Any, fake_upstream: FakeUpstream,
                                 http: aiohttp.ClientSession,
                                 caplog: pytest.LogCaptureFixture) -> None:
    gw = make_gateway(recall_stream_max_bytes=256 * KiB)
    fake_upstream.script(["big-stream:2"])
    body = await _stream(http, gw, "limit-stream")
    names = _one_failure(body, GATEWAY_FAILED, "Responses stream exceeded byte limit")
    assert "response.output_text.delta" in names  # it streamed live up to the limit
    assert 128 * KiB < len(body) < 512 * KiB
    assert "Responses stream exceeded byte limit" in caplog.text


async def test_deferred_event_limit(make_gateway: Any, fake_upstream: FakeUpstream,
                                    http: aiohttp.ClientSession,
                                    caplog: pytest.LogCaptureFixture) -> None:
    """A recall's hidden events count against the deferred bound: a recall whose
    arguments alone exceed it fails before anything of it reaches the client."""
    gw = make_gateway(recall_deferred_max_bytes=2 * KiB)
    fake_upstream.script(["recall:" + "rotation " * 150])
    body = await _stream(http, gw, "limit-deferred")
    _one_failure(body, RECALL_FAILED, "recall stream exceeded deferred event limit")
    assert b"function_call" not in body and b"rotation" not in body
    assert len(fake_upstream.model_requests) == 1  # no recall ran, no follow-up
    assert "recall stream exceeded deferred event limit" in caplog.text


async def test_retained_state_limit(make_gateway: Any, fake_upstream: FakeUpstream,
                                    http: aiohttp.ClientSession,
                                    caplog: pytest.LogCaptureFixture) -> None:
    """The spooled continuation outgrows the retained bound: a resource limit, so
    no recovery request; the client gets no part of the continuation."""
    gw = make_gateway(recall_retained_max_bytes=64 * KiB)
    fake_upstream.script(["recall:rotation", "big-stream:1"])
    body = await _stream(http, gw, "limit-retained")
    _one_failure(body, RECALL_FAILED)
    assert b"xxxx" not in body and b"lore-recall" not in body
    assert len(fake_upstream.model_requests) == 2
    assert "Responses retained state exceeded byte limit" in caplog.text


# --- E.2 protocol errors -------------------------------------------------------------


def _last_event(body: bytes) -> bytes:
    return body.rstrip(b"\n").rsplit(b"\n\n", 1)[-1]


def _replay(tmp_path: Path, frames: list[bytes]) -> str:
    path = tmp_path / "stream.sse"
    path.write_bytes(b"".join(frames))
    return f"replay:{path}"


async def test_malformed_json_in_a_response_event(
        gateway: Any, fake_upstream: FakeUpstream, http: aiohttp.ClientSession,
        caplog: pytest.LogCaptureFixture) -> None:
    fake_upstream.script(["malformed-event"])
    body = await _stream(http, gateway, "e2-malformed")
    _one_failure(body, GATEWAY_FAILED,
                 "malformed JSON in Responses event response.output_text.delta")
    assert "malformed JSON in Responses event response.output_text.delta" in caplog.text


async def test_payload_type_that_does_not_match_its_event(
        gateway: Any, fake_upstream: FakeUpstream, http: aiohttp.ClientSession,
        caplog: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    frames = list(fs.responses_text("hello there", "gpt-fake", 2).frames)
    frames[3] = frames[3].replace(b"event: response.", b"event: response.refusal_", 1)
    name = frames[3].split(b"\n", 1)[0].removeprefix(b"event: ").decode()
    fake_upstream.script([_replay(tmp_path, frames)])
    body = await _stream(http, gateway, "e2-mismatch")
    _one_failure(body, GATEWAY_FAILED, "Responses payload type does not match")
    assert f"Responses payload type does not match {name}" in caplog.text


async def test_empty_data_and_done_are_ignored_other_events_pass(
        gateway: Any, fake_upstream: FakeUpstream, http: aiohttp.ClientSession,
        tmp_path: Path) -> None:
    frames = list(fs.responses_text("hello there", "gpt-fake", 2).frames)
    vendor = b"event: vendor.note\ndata: not json at all\n\n"
    frames[3:3] = [b"data: \n\n", b"data: [DONE]\n\n", vendor]
    fake_upstream.script([_replay(tmp_path, frames)])
    body = await _stream(http, gateway, "e2-extras")
    assert vendor in body
    assert b"[DONE]" not in body and b"data: \n\n" not in body
    assert _last_event(body).startswith(b"event: response.completed\n")
    kept = [f for i, f in enumerate(frames) if i not in (3, 4)]
    assert body == b"".join(kept)


async def test_non_json_event_is_deferred_while_a_recall_is_open(
        gateway: Any, fake_upstream: FakeUpstream, http: aiohttp.ClientSession,
        tmp_path: Path) -> None:
    """Arriving after the recall call, it is held and delivered with the answer,
    after the anchor item, never before the recall ran."""
    arguments = orjson.dumps({"query": "rotation"}).decode()
    frames = list(fs.responses_call("recall", arguments, "gpt-fake").frames)
    vendor = b"event: vendor.note\ndata: not json at all\n\n"
    frames.insert(-1, vendor)
    fake_upstream.script([_replay(tmp_path, frames), "text:It rotates weekly."])
    body = await _stream(http, gateway, "e2-deferred-extra")
    assert body.count(vendor) == 1
    assert body.index(b"lore-recall:") < body.index(vendor) < body.index(b"It rotates weekly.")
    assert _last_event(body).startswith(b"event: response.completed\n")


async def test_principal_read_failure_is_not_a_follow_up_failure(
        make_gateway: Any, fake_upstream: FakeUpstream, http: aiohttp.ClientSession,
        caplog: pytest.LogCaptureFixture) -> None:
    """The first upstream answer breaking off is the principal's transport failing:
    no follow-up was ever sent, so the category must not say one was (issue 9 §7)."""
    gw = make_gateway()
    fake_upstream.script(["reset-mid-stream:4"])
    body = await _stream(http, gw, "principal-reset")
    _one_failure(body, GATEWAY_FAILED, "the upstream connection broke mid-response")
    assert "category=principal_transport" in caplog.text
    assert "follow_up_transport" not in caplog.text


def test_too_many_recovery_ids_is_a_protocol_error() -> None:
    """``FreshIds`` fails with the error the interceptor turns into one
    ``response.failed``, never an exception that cuts the stream."""
    from lore_gateway.protocols.common import ProtocolError
    from lore_gateway.recall.responses.recovery import MAX_IDS, FreshIds

    fresh = FreshIds()
    for i in range(MAX_IDS):
        fresh.item({"type": "message", "id": f"msg_{i}"})
    with pytest.raises(ProtocolError, match="more than 4096 item ids"):
        fresh.item({"type": "message", "id": "msg_one_too_many"})
