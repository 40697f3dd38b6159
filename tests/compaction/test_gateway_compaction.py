"""Through a running gateway: usage scaled for the agents only, compactions
answered from memory or (no memory) passed through untouched, counted."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from lore_gateway.compaction.detect import CLAUDE_SUMMARY_PREAMBLE
from lore_gateway.compaction.summary import SUMMARY_HEADING
from lore_gateway.compaction.usage import claude_cap, codex_cap
from lore_gateway.obs import metrics
from lore_gateway.obs.status import snapshot
from lore_gateway.sse import SSEDecoder
from lore_gateway.testing import FakeUpstream, wait_until

HERE = Path(__file__).resolve().parent
CLAUDE_COMPACT = json.loads((HERE / "claude_code_compact_request.json").read_text())
CLAUDE_HEADERS = {"user-agent": "claude-cli/2.1.197 (external, sdk-cli)", "x-api-key": "sk-ant-x",
                  "anthropic-version": "2023-06-01"}
CODEX_HEADERS = {"originator": "codex_exec", "authorization": "Bearer sk-x"}
FACT = "The billing service deploys from the tangerine branch."
HUGE = 500_000


def _events(body: bytes) -> list[dict[str, Any]]:
    decoder = SSEDecoder()
    return [orjson.loads(e.data) for e in [*decoder.feed(body), *decoder.close()]
            if e.data.startswith("{")]


def _metric(name: str, **labels: str) -> float:
    value = metrics.REGISTRY.get_sample_value(name, labels)
    return value or 0.0


async def _post(http: aiohttp.ClientSession, url: str, body: dict[str, Any],
                headers: dict[str, str]) -> tuple[int, bytes]:
    async with http.post(url, data=orjson.dumps(body),
                         headers={"content-type": "application/json", **headers}) as resp:
        return resp.status, await resp.read()


def _claude_turn(session: str, text: str, stream: bool = True) -> tuple[dict[str, Any], dict]:
    body = {"model": "claude-opus-4-8", "max_tokens": 64000, "stream": stream,
            "system": [{"type": "text", "text": "You are Claude Code. " * 40}],
            "tools": [{"name": "Bash", "description": "run", "input_schema": {"type": "object"}}],
            "messages": [{"role": "user", "content": [{"type": "text", "text": text,
                                                        "cache_control": {"type": "ephemeral"}}]}]}
    return body, {**CLAUDE_HEADERS, "x-claude-code-session-id": session}


async def test_claude_code_is_shown_the_cap_while_metrics_keep_the_real_figure(
        make_gateway: Any, fake_upstream: FakeUpstream, http: aiohttp.ClientSession) -> None:
    gw = make_gateway()
    fake_upstream.reported_input_tokens = HUGE
    before = _metric("lore_prompt_input_tokens_total", protocol="anthropic")
    body, headers = _claude_turn("scale-1", "hello")
    status, raw = await _post(http, gw.url + "/v1/messages?beta=true", body, headers)
    assert status == 200
    start = next(e for e in _events(raw) if e["type"] == "message_start")
    usage = start["message"]["usage"]
    shown = sum(usage[k] for k in ("input_tokens", "cache_creation_input_tokens",
                                   "cache_read_input_tokens", "output_tokens"))
    assert 0.99 * claude_cap(200_000, 64000) <= shown <= claude_cap(200_000, 64000)
    # Frames without usage are the upstream's bytes, untouched.
    assert b'"text_delta"' in raw and fake_upstream.text.split()[0].encode() in raw
    deadline = time.monotonic() + 5
    while _metric("lore_prompt_input_tokens_total", protocol="anthropic") < before + HUGE:
        assert time.monotonic() < deadline, "the real usage never reached the metrics"
        await asyncio.sleep(0.02)

    json_body, _ = _claude_turn("scale-1", "hello", stream=False)
    status, raw = await _post(http, gw.url + "/v1/messages", json_body, headers)
    assert status == 200 and orjson.loads(raw)["usage"]["input_tokens"] <= claude_cap(
        200_000, 64000)


async def test_codex_is_shown_the_cap_and_sdk_clients_the_real_usage(
        make_gateway: Any, fake_upstream: FakeUpstream, http: aiohttp.ClientSession) -> None:
    gw = make_gateway()
    fake_upstream.reported_input_tokens = HUGE
    body = {"model": "gpt-5", "stream": True, "input": "hi"}
    status, raw = await _post(http, gw.url + "/v1/responses", body,
                              {**CODEX_HEADERS, "session-id": "codex-scale"})
    assert status == 200
    done = next(e for e in _events(raw) if e["type"] == "response.completed")
    usage = done["response"]["usage"]
    assert usage["total_tokens"] <= codex_cap(272_000)
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]

    status, raw = await _post(http, gw.url + "/v1/responses", body, {"authorization": "Bearer k"})
    done = next(e for e in _events(raw) if e["type"] == "response.completed")
    assert done["response"]["usage"]["input_tokens"] == HUGE  # an SDK: nothing scaled


async def test_usage_scaling_can_be_turned_off(
        make_gateway: Any, fake_upstream: FakeUpstream, http: aiohttp.ClientSession) -> None:
    gw = make_gateway(usage_scaling=False)
    fake_upstream.reported_input_tokens = HUGE
    body, headers = _claude_turn("scale-off", "hello")
    _, raw = await _post(http, gw.url + "/v1/messages?beta=true", body, headers)
    start = next(e for e in _events(raw) if e["type"] == "message_start")
    assert start["message"]["usage"]["input_tokens"] == HUGE


async def test_claude_summary_without_memory_passes_through_then_is_answered(
        make_gateway: Any, fake_upstream: FakeUpstream, http: aiohttp.ClientSession) -> None:
    gw = make_gateway()
    session = "summary-session"
    headers = {**CLAUDE_HEADERS, "x-claude-code-session-id": session}
    answered = _metric("lore_compactions_total", flow="claude_summary", outcome="answered")
    # No memory of this session: the fork goes upstream untouched.
    status, _ = await _post(http, gw.url + "/v1/messages?beta=true", CLAUDE_COMPACT, headers)
    assert status == 200
    (forwarded,) = fake_upstream.model_requests
    assert orjson.loads(forwarded.body) == CLAUDE_COMPACT
    gw.memory.flush(timeout=10)
    assert gw.memory.session_messages(None, session) == []  # and not stored

    body, _ = _claude_turn(session, f"Remember this: {FACT}")
    await _post(http, gw.url + "/v1/messages?beta=true", body, headers)
    deadline = time.monotonic() + 10
    while not any(FACT in m.content for m in gw.memory.session_messages(None, session)):
        assert time.monotonic() < deadline
        gw.memory.flush(timeout=10)
        await asyncio.sleep(0.02)

    fake_upstream.reset()
    status, raw = await _post(http, gw.url + "/v1/messages?beta=true", CLAUDE_COMPACT, headers)
    assert status == 200
    assert fake_upstream.model_requests == []
    text = "".join(e["delta"].get("text", "") for e in _events(raw)
                   if e["type"] == "content_block_delta")
    assert "<summary>" in text and SUMMARY_HEADING in text and FACT in text
    assert _metric("lore_compactions_total", flow="claude_summary",
                   outcome="answered") == answered + 1
    section = snapshot(gw.settings)["compaction"]
    assert section["answered"]["claude_summary"] >= 1
    assert section["client_caps"] == {"claude-code": 150_300, "codex": 220_320}
    # The summary request itself is not stored as a turn of the session.
    assert not any(CLAUDE_SUMMARY_PREAMBLE in m.content
                   for m in gw.memory.session_messages(None, session))


async def test_responses_compact_endpoint_from_memory_or_passed_through(
        make_gateway: Any, fake_upstream: FakeUpstream, http: aiohttp.ClientSession) -> None:
    gw = make_gateway()
    compact = {"model": "gpt-5", "input": [{"type": "message", "role": "user",
                                            "content": "hi"}], "instructions": ""}
    for path in ("/v1/responses/compact", "/backend-api/codex/responses/compact"):
        fake_upstream.reset()
        headers = {**CODEX_HEADERS, "session-id": f"nothing-{path}"}
        status, raw = await _post(http, gw.url + path, compact, headers)
        assert status == 200, raw
        assert [r.route for r in fake_upstream.requests] == [path]
        assert orjson.loads(raw)["output"][-1]["type"] == "compaction"  # the fake's own

    session = "compact-endpoint"
    headers = {**CODEX_HEADERS, "session-id": session}
    # A coding turn (tools, a real system prompt): side channels are no memory.
    turn = {"model": "gpt-5", "stream": True, "input": f"Remember this: {FACT}",
            "instructions": "You are Codex, a coding agent. " * 20,
            "tools": [{"type": "function", "name": "exec_command", "parameters": {}}]}
    await _post(http, gw.url + "/v1/responses", turn, headers)
    deadline = time.monotonic() + 10
    while not any(FACT in m.content for m in gw.memory.session_messages(None, session)):
        assert time.monotonic() < deadline
        gw.memory.flush(timeout=10)
        await asyncio.sleep(0.02)
    fake_upstream.reset()
    status, raw = await _post(http, gw.url + "/v1/responses/compact", compact, headers)
    assert status == 200 and fake_upstream.requests == []
    (item,) = orjson.loads(raw)["output"]
    assert item["type"] == "message" and FACT in item["content"][0]["text"]


async def test_an_sdk_clients_own_summary_prompt_is_never_intercepted(
        make_gateway: Any, fake_upstream: FakeUpstream, http: aiohttp.ClientSession) -> None:
    gw = make_gateway()
    session = "sdk-summary"
    body, _ = _claude_turn(session, f"Remember this: {FACT}")
    sdk = {"x-api-key": "sk-ant-x", "anthropic-version": "2023-06-01",
           "x-lore-session-id": session}
    await _post(http, gw.url + "/v1/messages", body, sdk)
    deadline = time.monotonic() + 10
    while not any(FACT in m.content for m in gw.memory.session_messages(None, session)):
        assert time.monotonic() < deadline
        gw.memory.flush(timeout=10)
        await asyncio.sleep(0.02)
    fake_upstream.reset()
    status, _ = await _post(http, gw.url + "/v1/messages", CLAUDE_COMPACT, sdk)
    assert status == 200
    assert len(fake_upstream.model_requests) == 1  # went upstream: not Claude Code


def test_the_summary_holds_the_sessions_distillations_and_knowledge(
        make_gateway: Any, fake_upstream: FakeUpstream, tmp_path: Path) -> None:
    """With the worker on, the session's distillations (and the curated knowledge)
    make up the summary a compaction gets."""
    import sys

    sys.path.insert(0, str(HERE.parent / "knowledge"))
    from kit import AnthropicSession, git_project, post, read

    from lore_gateway.distill import store as dstore

    gw = make_gateway(worker=True, distill_segment_tokens=1, distill_idle_s=3600)
    project = git_project(tmp_path / "work")
    chat = AnthropicSession(gw, project, "distilled-session")
    chat.say(f"Decision: {FACT} Main is frozen.")
    distilled = wait_until(lambda: read(gw, lambda c: dstore.active(
        c, "personal", "distilled-session")), "a distillation")
    compact = {**CLAUDE_COMPACT, "system": chat.system,
               "messages": [*chat.messages, CLAUDE_COMPACT["messages"][-1]]}
    compact["messages"][0] = {"role": "user", "content": [
        {"type": "text", "text": chat.messages[0]["content"][0]["text"],
         "cache_control": {"type": "ephemeral"}}]}
    fake_upstream.reset()
    raw = post(gw.url + "/v1/messages?beta=true", compact, {
        **CLAUDE_HEADERS, "x-lore-session-id": "distilled-session"})
    assert not [r for r in fake_upstream.model_requests if "x-lore-worker" not in r.headers]
    text = "".join(e["delta"].get("text", "") for e in _events(raw)
                   if e["type"] == "content_block_delta")
    assert "## Conversation history" in text
    from lore_gateway.distill import format as fmt

    # The worker's log, each observation shown under its clock time.
    _, observations = fmt.parse(distilled[0].text)
    for obs in observations:
        assert f"({obs.time})" in text and f"* {obs.mark} {obs.text}" in text


async def test_compaction_trigger_without_memory_goes_upstream_with_memory_ours(
        make_gateway: Any, fake_upstream: FakeUpstream, http: aiohttp.ClientSession) -> None:
    from lore_gateway.compaction.answers import HANDLE_PREFIX, summary_of_handle
    from lore_gateway.testing.fake_compaction import FAKE_ENCRYPTED

    gw = make_gateway()
    session = "trigger-session"
    headers = {**CODEX_HEADERS, "session-id": session}
    tools = [{"type": "function", "name": "exec_command", "parameters": {}}]
    history = [{"type": "message", "role": "developer", "content": [
        {"type": "input_text", "text": "You are Codex, a coding agent. " * 20}]},
        {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": f"Remember this: {FACT}"}]}]
    trigger = {"model": "gpt-5", "stream": True, "tools": tools,
               "input": [*history, {"type": "compaction_trigger"}]}
    status, raw = await _post(http, gw.url + "/v1/responses", trigger, headers)
    assert status == 200
    (forwarded,) = fake_upstream.model_requests
    assert orjson.loads(forwarded.body) == trigger  # untouched: no memory yet
    assert FAKE_ENCRYPTED.encode() in raw

    await _post(http, gw.url + "/v1/responses", {"model": "gpt-5", "stream": True,
                                                  "tools": tools, "input": history}, headers)
    deadline = time.monotonic() + 10
    while not any(FACT in m.content for m in gw.memory.session_messages(None, session)):
        assert time.monotonic() < deadline
        gw.memory.flush(timeout=10)
        await asyncio.sleep(0.02)
    fake_upstream.reset()
    status, raw = await _post(http, gw.url + "/v1/responses", trigger, headers)
    assert status == 200 and fake_upstream.model_requests == []
    items = [e["item"] for e in _events(raw) if e["type"] == "response.output_item.done"]
    assert [i["type"] for i in items] == ["compaction"]
    assert items[0]["encrypted_content"].startswith(HANDLE_PREFIX)
    assert FACT in (summary_of_handle(items[0]["encrypted_content"]) or "")

    # The next turn carries our item; upstream gets the summary in its place.
    follow = {"model": "gpt-5", "stream": True, "tools": tools,
              "input": [history[0], items[0], {"type": "message", "role": "user",
                                                "content": "go on"}]}
    status, _ = await _post(http, gw.url + "/v1/responses", follow, headers)
    assert status == 200
    (sent,) = fake_upstream.model_requests
    assert HANDLE_PREFIX.encode() not in sent.body
    assert SUMMARY_HEADING.encode() in sent.body and FACT.encode() in sent.body
