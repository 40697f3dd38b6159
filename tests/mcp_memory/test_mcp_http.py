"""The gateway's ``/mcp``: the official MCP SDK's client over streamable HTTP.

Personal mode answers this machine's clients (a foreign ``Host`` or ``Origin``
is refused, as a browser tricked by DNS rebinding would send); team mode
answers only a valid gateway key, and a key's tools see that key's memory alone.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import orjson
import pytest
from mcp import Client
from mcp_kit import (
    BLOCK_HEADING,
    REF,
    TOOLS,
    error_of,
    git_project,
    http_server,
    knowledge_block_of_next_session,
    remember,
    run,
    text_of,
    tool_names,
)

from lore_gateway.errors import GatewayError
from lore_gateway.knowledge import store as kstore
from lore_gateway.memory.tenancy import keys
from lore_gateway.memory.tenancy.identity import INVALID_KEY_MESSAGE, MISSING_KEY_MESSAGE
from lore_gateway.testing import FakeUpstream

pytestmark = pytest.mark.both_backends

FACT = "The payments queue is drained by the worker named otter-7 every night."
QUERY = "payments queue drained worker otter"
RULE = "Schema migrations run from the ops laptop only, never from CI."
FACT_A = "Alice's build cache lives in /srv/cache-amber."
FACT_B = "Bob's secret project codename is heliotrope."
INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {},
    "clientInfo": {"name": "raw", "version": "1"}}}


def post(url: str, headers: dict[str, str]) -> tuple[int, bytes]:
    """A raw JSON-RPC POST to /mcp: (status, body)."""
    request = urllib.request.Request(url + "/mcp", data=orjson.dumps(INITIALIZE), method="POST",
                                     headers={"content-type": "application/json",
                                              "accept": "application/json, text/event-stream",
                                              **headers})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_recall_and_knowledge_over_http(make_gateway: Any, fake_upstream: FakeUpstream,
                                        tmp_path: Path, mode: str) -> None:
    gw = make_gateway()
    project = git_project(tmp_path / "repo").resolve()
    remember(gw, project, "claude-one", FACT)

    async def talk() -> tuple[set[str], str, str, str]:
        transport = http_server(gw.url + "/mcp", {"x-lore-project": str(project)})
        async with Client(transport, mode=mode) as client:
            names = await tool_names(client)
            found = await text_of(client, "recall", {"query": QUERY, "scope": "project"})
            message = await text_of(client, "get_message",
                                    {"ref": f"t:{REF.findall(found)[0]}"})
            added = await text_of(client, "knowledge", {
                "action": "add", "title": "Where migrations run", "content": RULE})
            return names, found, message, added

    names, found, message, added = run(talk)
    assert names == TOOLS
    assert "otter-7" in found and "otter-7" in message
    assert added.startswith("added [decision] Where migrations run") and str(project) in added
    system = knowledge_block_of_next_session(gw, fake_upstream, project, "claude-two")
    assert BLOCK_HEADING in system and RULE in system


def test_personal_mode_refuses_a_foreign_host_or_origin(make_gateway: Any) -> None:
    gw = make_gateway()
    status, _ = post(gw.url, {})
    assert status == 200
    assert post(gw.url, {"host": "attacker.example"})[0] == 421
    assert post(gw.url, {"origin": "http://attacker.example"})[0] == 403


@pytest.fixture
def team(make_gateway: Any, tmp_path: Path) -> dict[str, Any]:
    # Alice and Bob share one checkout here, and .lore.md is a file of the repository,
    # shared on purpose (docs/knowledge.md): without it, only the database is compared.
    gw = make_gateway(tenancy="keys", export=False)
    (_, key_a) = gw.memory.write_job(lambda c: keys.create(c, "alice"))
    (_, key_b) = gw.memory.write_job(lambda c: keys.create(c, "bob"))
    _wait_for_keys(gw, key_a, key_b)
    project = git_project(tmp_path / "repo").resolve()
    remember(gw, project, "alice-1", FACT_A, headers={"x-lore-key": key_a}, tenant="alice")
    remember(gw, project, "bob-1", FACT_B, headers={"x-lore-key": key_b}, tenant="bob")
    entry_b, _ = gw.memory.write_job(lambda c: kstore.upsert(
        c, tenant="bob", project=str(project), category="decision",
        title="Heliotrope launch", content="Launch heliotrope on Friday."))
    bob_message = gw.memory.read(lambda c: c.execute(
        "SELECT id FROM messages WHERE tenant = 'bob' LIMIT 1").fetchone()[0])
    return {"gw": gw, "project": project, "key_a": key_a, "key_b": key_b,
            "entry_b": entry_b, "bob_message": bob_message}


def _wait_for_keys(gw: Any, *secrets: str) -> None:
    """Until the running gateway's key ring has re-read the keys table (about 1 s)."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            for secret in secrets:
                gw.memory.tenancy.tenant({keys.KEY_HEADER: secret})
            return
        except GatewayError:
            time.sleep(0.05)
    raise AssertionError("the gateway never saw the new keys")


def test_team_mode_refuses_a_request_without_a_valid_key(team: dict[str, Any]) -> None:
    url = team["gw"].url
    status, body = post(url, {})
    assert status == 401 and orjson.loads(body)["error"]["message"] == MISSING_KEY_MESSAGE
    status, body = post(url, {"x-lore-key": "lore_k_not-a-key"})
    assert status == 401 and orjson.loads(body)["error"]["message"] == INVALID_KEY_MESSAGE
    assert post(url, {"x-lore-key": team["key_a"]})[0] == 200

    async def connect() -> None:
        async with Client(http_server(url + "/mcp"), mode="legacy") as client:
            await tool_names(client)

    with pytest.raises(BaseException) as refused:  # the SDK's client gives up at once,
        run(connect)
    assert MISSING_KEY_MESSAGE in _messages(refused.value)  # saying what to do


def _messages(exc: BaseException) -> str:
    """Every message in an exception and the groups and causes around it."""
    parts = [f"{type(exc).__name__}: {exc}"]
    for inner in getattr(exc, "exceptions", ()):
        parts.append(_messages(inner))
    if exc.__cause__ is not None:
        parts.append(_messages(exc.__cause__))
    return "\n".join(parts)


def test_one_key_cannot_see_another_keys_memory(team: dict[str, Any],
                                                fake_upstream: FakeUpstream) -> None:
    gw, project = team["gw"], team["project"]
    headers = {"x-lore-key": team["key_a"], "x-lore-project": str(project)}

    async def as_alice() -> dict[str, str]:
        async with Client(http_server(gw.url + "/mcp", headers)) as client:
            return {
                "own": await text_of(client, "recall", {"query": "build cache amber"}),
                "other": await text_of(client, "recall", {"query": "secret codename heliotrope"}),
                "sessions": await text_of(client, "search_sessions", {}),
                "message": await error_of(client, "get_message",
                                          {"ref": f"t:{team['bob_message']}"}),
                "list": await text_of(client, "knowledge", {"action": "list"}),
                "edit": await error_of(client, "knowledge", {
                    "action": "edit", "entry_id": team["entry_b"].id, "content": "Mine now."}),
                "add": await text_of(client, "knowledge", {
                    "action": "add", "title": "Amber cache", "content": "The cache is amber."}),
            }

    seen = run(as_alice)
    assert "cache-amber" in seen["own"]
    assert "heliotrope" not in seen["other"]
    assert "alice-1" in seen["sessions"] and "bob-1" not in seen["sessions"]
    assert "no stored message" in seen["message"]
    assert "Heliotrope" not in seen["list"]
    assert "no knowledge entry" in seen["edit"]
    assert seen["add"].startswith("added [decision] Amber cache")
    # Alice's entry reaches her next session, not Bob's.
    alice = knowledge_block_of_next_session(gw, fake_upstream, project, "alice-2",
                                            headers={"x-lore-key": team["key_a"]})
    bob = knowledge_block_of_next_session(gw, fake_upstream, project, "bob-2",
                                          headers={"x-lore-key": team["key_b"]})
    assert "The cache is amber." in alice and "Heliotrope" not in alice
    assert "The cache is amber." not in bob and "Launch heliotrope on Friday." in bob
