"""Through the real gateway: a recall never finds earlier recalls, and a query that
matches nothing stored gets the "nothing found" text, not made-up matches."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp

from lore_gateway.memory.search.render import NO_RESULTS, RECALL_CALL_PREFIX, is_recall_traffic
from lore_gateway.testing import FakeUpstream

KEY = "sk-recall-hits-0123456789abcdef"
FACT = "The zeppelin hangar door code is 4417, changed every full moon."
QUERY = "zeppelin hangar door code"
TOOLS = [{"type": "function", "name": "exec",
          "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}]


async def _ask(http: aiohttp.ClientSession, gw: Any, session: str, text: str) -> int:
    headers = {"authorization": f"Bearer {KEY}", "x-lore-session-id": session,
               "x-lore-project": "/work/recall-hits"}
    body = {"model": "gpt-fake", "input": text, "tools": TOOLS}
    async with http.post(gw.url + "/v1/responses", json=body, headers=headers) as r:
        await r.read()
        return r.status


def _wait_stored(gw: Any, session: str, turns: int) -> None:
    """Storage runs after delivery: wait for the writer, bounded."""
    deadline = time.monotonic() + 10
    while gw.memory.count_turns(None, session=session) < turns and time.monotonic() < deadline:
        gw.memory.flush(timeout=10)
        time.sleep(0.01)
    assert gw.memory.count_turns(None, session=session) >= turns


def _recall_output(fake: FakeUpstream) -> str:
    """The recall result the gateway gave the model in its follow-up request."""
    follow = fake.model_requests[-1].json["input"]
    assert follow[-1]["type"] == "function_call_output"
    return str(follow[-1]["output"])


async def test_recall_results_never_hold_earlier_recalls(
        gateway: Any, fake_upstream: FakeUpstream, http: aiohttp.ClientSession) -> None:
    assert await _ask(http, gateway, "hits-seed", f"{FACT} Remember it.") == 200
    await asyncio.to_thread(_wait_stored, gateway, "hits-seed", 1)
    # Two recalls of the same words in another session: the second one must find the
    # fact, not the first recall's call (stored as "[tool_call:recall] {...}").
    for turn in (1, 2):
        fake_upstream.reset()
        fake_upstream.script([f"recall:{QUERY}", "text:Noted."])
        assert await _ask(http, gateway, "hits-recall", "What is the hangar door code?") == 200
        await asyncio.to_thread(_wait_stored, gateway, "hits-recall", turn)
        output = _recall_output(fake_upstream)
        assert "4417" in output
        assert RECALL_CALL_PREFIX.strip() not in output and "\"query\"" not in output
    stored = [m.content for m in gateway.memory.session_messages(None, "hits-recall")]
    assert sum(c.startswith(RECALL_CALL_PREFIX) for c in stored) == 2  # they are stored
    ident = gateway.memory.identify("responses", {"authorization": f"Bearer {KEY}",
                                                  "x-lore-session-id": "hits-recall"}, {})
    hits = gateway.memory.search_sync(QUERY, identity=ident, scope="all").hits
    assert hits and not any(is_recall_traffic(h.content) for h in hits)


async def test_a_recall_for_nonsense_says_nothing_was_found(
        gateway: Any, fake_upstream: FakeUpstream, http: aiohttp.ClientSession) -> None:
    assert await _ask(http, gateway, "hits-none-seed", f"{FACT} Remember it.") == 200
    await asyncio.to_thread(_wait_stored, gateway, "hits-none-seed", 1)
    fake_upstream.reset()
    fake_upstream.script(["recall:zzqx quasar xylophone marmalade", "text:Nothing there."])
    assert await _ask(http, gateway, "hits-none", "Anything about zzqx?") == 200
    assert _recall_output(fake_upstream) == NO_RESULTS
