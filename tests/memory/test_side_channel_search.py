"""Why a call is a side channel decides whether search shows it (issue 33): a
tool-less chat app's first request is a one-shot, kept out of knowledge, but its
question and answer are the conversation's and recall finds them; OpenCode's
title call quotes the same words and never comes back.

Through a running gateway: the chat request and the title call as the clients
send them (``testing/client_shapes.py``), then ``POST /lore/recall`` (what
``lore recall`` asks a running gateway) and ``lore recall`` itself.
"""

from __future__ import annotations

import json
import time
import urllib.request
from typing import Any

import httpx2 as httpx
import orjson
import pytest
from typer.testing import CliRunner

from lore_gateway.cli.main import _register, app
from lore_gateway.local_recall import LOCAL_RECALL_PATH, database_name
from lore_gateway.memory.search.hits import text_key
from lore_gateway.testing import ANTHROPIC_KEY, OPENAI_KEY, FakeUpstream
from lore_gateway.testing import client_shapes as shapes

QUERY = "kestrel aviary heater overnight"
QUESTION = "What temperature should the kestrel aviary heater hold overnight?"
ANSWER = "Keep the kestrel aviary heater at 18 degrees overnight."
TITLE = "Kestrel aviary heater overnight"


def post(gw: Any, path: str, body: dict[str, Any], headers: dict[str, str]) -> None:
    request = urllib.request.Request(gw.url + path, data=orjson.dumps(body), method="POST",
                                     headers={"content-type": "application/json", **headers})
    with urllib.request.urlopen(request, timeout=30) as resp:
        assert resp.status == 200
        resp.read()


def stored(gw: Any, rows: int) -> list[tuple[str, str]]:
    """(content, side-channel reason) of every stored message, once ``rows`` are."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        gw.memory.flush(timeout=10)
        found = gw.memory.read(lambda c: c.execute(
            "SELECT content, meta FROM messages ORDER BY id").fetchall())
        if len(found) >= rows:
            return [(str(content), str(json.loads(meta).get("side_channel")) if meta else "")
                    for content, meta in found]
        time.sleep(0.02)
    raise AssertionError(f"fewer than {rows} messages were stored")


def test_a_tool_less_apps_first_exchange_is_found_and_a_title_call_is_not(
        make_gateway: Any, fake_upstream: FakeUpstream,
        monkeypatch: pytest.MonkeyPatch) -> None:
    gw = make_gateway(search_workers=1)
    fake_upstream.script([f"text:{ANSWER}", f"text:{TITLE}"])
    # A chat app without tools: its very first request (a one-shot).
    post(gw, "/v1/chat/completions", {"model": "gpt-fake", "messages": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": QUESTION}]}, {"authorization": f"Bearer {OPENAI_KEY}"})
    # OpenCode's title call for a conversation that asked the same.
    post(gw, "/v1/messages", shapes.opencode_title_request(QUESTION), {
        "x-api-key": ANTHROPIC_KEY, "anthropic-version": "2023-06-01",
        **shapes.opencode_headers("ses_0003cccc")})
    rows = stored(gw, 4)
    assert [(text_key(c).split(":")[0], reason) for c, reason in rows] == [
        (QUESTION, "one_shot"), (ANSWER, "one_shot"),
        ("Generate a title for this conversation", "helper"), (TITLE, "helper")]

    body = {"db": database_name(gw.settings), "query": QUERY, "limit": 10, "scope": "all",
            "project": ""}
    answer = httpx.post(gw.url + LOCAL_RECALL_PATH, json=body, timeout=120).json()
    assert_found(h["content"] for h in answer["hits"])

    for name, value in (("LORE_DATA_DIR", str(gw.settings.data_dir)),
                        ("LORE_HOST", "127.0.0.1"), ("LORE_PORT", str(gw.port))):
        monkeypatch.setenv(name, value)
    _register()
    result = CliRunner().invoke(app, ["recall", QUERY, "--json"])
    assert result.exit_code == 0, result.output
    assert_found(h["content"] for h in json.loads(result.output.splitlines()[-1])["hits"])


def assert_found(contents: Any) -> None:
    keys = {text_key(c) for c in contents}
    assert {QUESTION, ANSWER} <= keys, keys
    assert not any("Generate a title" in k or k == TITLE for k in keys), keys
