"""Who ``/mcp`` answers where loopback sockets cannot show it: the endpoint driven as
ASGI, as uvicorn drives it, with a client address from elsewhere or a gateway
bound beyond loopback (the HTTP tests cover the rest through a real gateway)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from mcp_kit import run

from lore_gateway.config import Settings
from lore_gateway.mcp_server.http import LOOPBACK_ONLY, McpEndpoint
from lore_gateway.memory.service import Memory
from lore_gateway.memory.tenancy import keys
from lore_gateway.memory.tenancy.identity import INVALID_KEY_MESSAGE, MISSING_KEY_MESSAGE

INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {},
    "clientInfo": {"name": "raw", "version": "1"}}}


@pytest.fixture
def memory(tmp_path: Path) -> Iterator[Memory]:
    opened = Memory.open(Settings(data_dir=tmp_path / "data", embeddings=False,
                                  search_process=False), embedder=None)
    yield opened
    opened.close()


def ask(settings: Settings, memory: Memory, client: str,
        headers: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    """One initialize POST to a fresh endpoint: (status, JSON body)."""
    endpoint = McpEndpoint(settings, memory)
    raw = [(b"host", b"127.0.0.1:3207"), (b"content-type", b"application/json"),
           (b"accept", b"application/json, text/event-stream"),
           *((k.encode(), v.encode()) for k, v in (headers or {}).items())]
    scope = {"type": "http", "method": "POST", "path": "/mcp", "raw_path": b"/mcp",
             "query_string": b"", "headers": raw, "client": (client, 50000),
             "server": ("127.0.0.1", 3207), "scheme": "http", "http_version": "1.1",
             "root_path": ""}
    body = [orjson.dumps(INITIALIZE)]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if body:
            return {"type": "http.request", "body": body.pop(), "more_body": False}
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def go() -> int:
        try:
            return await endpoint(scope, receive, send)
        finally:
            await endpoint.close()

    status = run(go)
    answer = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return status, orjson.loads(answer)


def test_personal_mode_answers_this_machine_only(tmp_path: Path, memory: Memory) -> None:
    settings = Settings(data_dir=tmp_path / "data")
    status, answer = ask(settings, memory, "192.0.2.7")
    assert status == 403 and answer["error"]["message"] == LOOPBACK_ONLY
    status, answer = ask(settings, memory, "127.0.0.1")
    assert status == 200 and answer["result"]["serverInfo"]["name"] == "lore"


def test_a_gateway_bound_beyond_loopback_asks_any_live_key(tmp_path: Path,
                                                           memory: Memory) -> None:
    settings = Settings(data_dir=tmp_path / "data", host="0.0.0.0")
    _, secret = memory.write_job(lambda c: keys.create(c, "alice"))
    status, answer = ask(settings, memory, "192.0.2.7")
    assert status == 401 and answer["error"]["message"] == MISSING_KEY_MESSAGE
    status, answer = ask(settings, memory, "192.0.2.7", {"x-lore-key": "lore_k_wrong"})
    assert status == 401 and answer["error"]["message"] == INVALID_KEY_MESSAGE
    status, answer = ask(settings, memory, "192.0.2.7", {"x-lore-key": secret})
    assert status == 200 and answer["result"]["serverInfo"]["name"] == "lore"
