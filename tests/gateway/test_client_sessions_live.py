"""Sessions as clients define them, through a running gateway (issue 33, item 4):
OpenCode's ``x-session-id`` (its title call lands in its session, marked a side
channel, and moves nothing), aider's conversations (no session id, a fixed
preamble) one session each however they grow.

Request shapes: ``testing/client_shapes.py`` (each named with its source).
"""

from __future__ import annotations

import time
import urllib.request
from typing import Any

import orjson

from lore_gateway.testing import ANTHROPIC_KEY, OPENAI_KEY, FakeUpstream
from lore_gateway.testing import client_shapes as shapes

PROJECT = "/home/dev/shop"


def post(gw: Any, path: str, body: dict[str, Any], headers: dict[str, str]) -> bytes:
    request = urllib.request.Request(gw.url + path, data=orjson.dumps(body), method="POST",
                                     headers={"content-type": "application/json", **headers})
    with urllib.request.urlopen(request, timeout=30) as resp:
        assert resp.status == 200
        data: bytes = resp.read()
    return data


def opencode(gw: Any, session: str, body: dict[str, Any]) -> bytes:
    return post(gw, "/v1/messages", body, {
        "x-api-key": ANTHROPIC_KEY, "anthropic-version": "2023-06-01",
        **shapes.opencode_headers(session)})


def aider(gw: Any, body: dict[str, Any]) -> bytes:
    return post(gw, "/v1/chat/completions", body, {"authorization": f"Bearer {OPENAI_KEY}"})


def settled(gw: Any, turns: int) -> list[Any]:
    """The gateway's sessions once ``turns`` turns are stored in all."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        gw.memory.flush(timeout=10)
        sessions = gw.memory.sessions(None)
        if sum(s.turns for s in sessions) >= turns:
            return sorted(sessions, key=lambda s: s.first_seen)
        time.sleep(0.02)
    raise AssertionError(f"fewer than {turns} turns were stored")


def side_channel_rows(gw: Any, session: str) -> list[tuple[str, bool]]:
    rows = gw.memory.read(lambda c: c.execute(
        "SELECT content, meta FROM messages WHERE session = ? ORDER BY id", (session,)
    ).fetchall())
    return [(content, meta is not None and "side_channel" in meta) for content, meta in rows]


def test_opencode_sessions_are_its_own_and_its_title_call_stays_aside(
        make_gateway: Any, fake_upstream: FakeUpstream) -> None:
    gw = make_gateway()
    ask = [{"role": "user", "content": "The cart total ignores discounts; fix it."}]
    opencode(gw, "ses_0001aaaa", shapes.opencode_request(PROJECT, ask))
    opencode(gw, "ses_0002bbbb", shapes.opencode_request(PROJECT, ask))
    settled(gw, 2)
    # Its title call: the same session id, no tools, no working directory.
    opencode(gw, "ses_0001aaaa", shapes.opencode_title_request(ask[0]["content"]))
    sessions = settled(gw, 3)
    assert [(s.session, s.project, s.turns) for s in sessions] == [
        ("ses_0001aaaa", PROJECT, 2), ("ses_0002bbbb", PROJECT, 1)]
    rows = side_channel_rows(gw, "ses_0001aaaa")
    assert [side for _, side in rows] == [False, False, True, True]
    assert rows[2][0].startswith("Generate a title for this conversation:")
    # The conversation's turns are coding turns (recall offered), the title's not.
    offered = ["recall" in str(r.json.get("tools")) for r in fake_upstream.model_requests]
    assert offered == [True, True, False]


def test_aider_conversations_are_two_sessions_and_one_grows_in_one(
        make_gateway: Any, fake_upstream: FakeUpstream) -> None:
    gw = make_gateway()
    one, two = shapes.AiderChat(reminder="user"), shapes.AiderChat(reminder="user")
    aider(gw, one.request("Add a --verbose flag to the CLI."))
    one.answered("Add the flag in src/app.py.")
    aider(gw, two.request("Why does the config loader crash on empty files?"))
    two.answered("It reads None.")
    settled(gw, 2)
    one.files = (*one.files, "src/cli.py")
    aider(gw, one.request("Now document it in the README."))
    one.answered("Done.")
    aider(gw, one.request("Thanks, and run the tests."))
    sessions = settled(gw, 4)
    assert [s.turns for s in sessions] == [3, 1]
    assert all(s.session.startswith("fp-") for s in sessions)
    first = gw.memory.session_messages(None, sessions[0].session)
    # (Stored as aider sent them: with its reminder appended, hence the split.)
    assert [m.content.split("\n\n")[0] for m in first if m.role == "user"] == [
        "Add a --verbose flag to the CLI.", "Now document it in the README.",
        "Thanks, and run the tests."]
    # Coding turns: nothing of them is marked a side channel.
    assert not any(side for _, side in side_channel_rows(gw, sessions[0].session))
