"""A gateway whose Postgres goes away: plain forwarding goes on, what needs memory
fails with one clear line, and once the database is back memory works again."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from psycopg.conninfo import conninfo_to_dict

from lore_gateway.testing import ANTHROPIC_KEY, BackgroundServer, FakeUpstream, gateway_settings

from .relay import Relay

AUTH = {"x-api-key": ANTHROPIC_KEY, "anthropic-version": "2023-06-01",
        "content-type": "application/json"}
UNREACHABLE = "the memory database cannot be reached"
TOOLS = [{"name": "exec", "description": "run a command",
          "input_schema": {"type": "object", "properties": {"cmd": {"type": "string"}}}}]


@pytest.fixture
def relay(postgres_url: str) -> Iterator[tuple[Relay, str]]:
    params = conninfo_to_dict(postgres_url)
    host = str(params.get("host") or "127.0.0.1")
    port = int(params.get("port") or 5432)
    with Relay(host, port) as relay:
        user = params.get("user") or "postgres"
        password = f":{params['password']}" if params.get("password") else ""
        dbname = params.get("dbname") or "postgres"
        yield relay, f"postgresql://{user}{password}@127.0.0.1:{relay.port}/{dbname}"


@pytest.fixture
def gateway(fake_upstream: FakeUpstream, relay: tuple[Relay, str],
            tmp_path: Path) -> Iterator[Any]:
    from lore_gateway.server import Gateway

    settings = gateway_settings(fake_upstream, tmp_path / "data", database_url=relay[1],
                                worker=False, knowledge=False)
    runner = BackgroundServer(Gateway(settings), name="gateway-on-relay")
    yield runner.start()
    runner.stop()


def ask(gw: Any, text: str, scenario: str, session: str = "lost-db") -> tuple[int, Any]:
    import urllib.error
    import urllib.request

    body = {"model": "claude-fake", "max_tokens": 100, "tools": TOOLS,
            "messages": [{"role": "user", "content": text}]}
    request = urllib.request.Request(gw.url + "/v1/messages", data=orjson.dumps(body),
                                     method="POST", headers={
                                         **AUTH, "x-lore-session-id": session,
                                         "x-fake-scenario": scenario})
    try:
        with urllib.request.urlopen(request, timeout=60) as resp:
            return resp.status, orjson.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, orjson.loads(exc.read())


def local_recall(gw: Any, query: str) -> tuple[int, Any]:
    import urllib.error
    import urllib.request

    body = {"db": gw.memory.database.url, "query": query, "scope": "all"}
    request = urllib.request.Request(gw.url + "/lore/recall", data=orjson.dumps(body),
                                     method="POST",
                                     headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as resp:
            return resp.status, orjson.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, orjson.loads(exc.read())


def test_forwarding_goes_on_and_memory_fails_clearly_while_postgres_is_gone(
        gateway: Any, fake_upstream: FakeUpstream, relay: tuple[Relay, str]) -> None:
    status, _ = ask(gateway, "The deploy key lives in vault tangerine.", "text:noted")
    assert status == 200
    gateway.memory.flush(30)
    assert local_recall(gateway, "deploy key tangerine")[0] == 200

    relay[0].cut()
    fake_upstream.reset()
    status, answer = ask(gateway, "Just say hello.", "text:hello there")
    assert status == 200 and answer["content"][0]["text"] == "hello there"
    (forwarded,) = fake_upstream.model_requests
    assert b"Just say hello." in forwarded.body

    fake_upstream.reset()
    status, answer = ask(gateway, "Where is the deploy key?", "recall:deploy key")
    assert status == 200
    _, follow_up = fake_upstream.model_requests
    assert UNREACHABLE.encode() in follow_up.body

    status, error = local_recall(gateway, "deploy key")
    assert status == 503
    message = error["error"]["message"]
    assert UNREACHABLE in message and "\n" not in message

    relay[0].restore()
    # Memory comes back by itself (a failed check is retried after a second).
    deadline = time.monotonic() + 30
    while local_recall(gateway, "deploy key")[0] != 200:
        assert time.monotonic() < deadline, "memory did not come back with the database"
        time.sleep(0.2)
    fake_upstream.reset()
    status, _ = ask(gateway, "Where is the deploy key now?", "recall:deploy key tangerine")
    assert status == 200
    _, follow_up = fake_upstream.model_requests
    assert b"tangerine" in follow_up.body and UNREACHABLE.encode() not in follow_up.body
    # The turns answered while the database was gone waited in the writer's queue.
    gateway.memory.flush(60)
    stored = gateway.memory.read(lambda c: [str(r[0]) for r in c.execute(
        "SELECT content FROM messages WHERE role = 'user'")])
    for text in ("Just say hello.", "Where is the deploy key?"):
        assert sum(text in s for s in stored) == 1, stored
