"""``POST /lore/recall``: memory search for ``lore recall``, answered by the running gateway.

A ``lore recall`` of its own has to start Python, open the database and load
the embedding model before it can search; the gateway has all of that warm, so
the CLI asks it first and answers in well under a second, falling back to a
local search when no gateway is up (``cli/memory_cmds.py``).

Only loopback clients are served: the route is for the local CLI, never for the
network, even when the gateway listens beyond 127.0.0.1. The caller names the
database it means (its ``db`` path); a gateway serving another data directory
answers 409 and the CLI searches locally instead. The tenant is decided as for
model requests: personal mode serves the one memory, team mode the tenant of
the ``X-Lore-Key`` key (401 without one).

Request: ``{"db", "query", "scope", "project", "session", "limit"}``.
Response: ``{"query", "scope", "tenants", "total", "hits": [...], "rendered"}``.
"""

from __future__ import annotations

import asyncio
import ipaddress
from typing import TYPE_CHECKING, Any

import orjson

from lore_gateway.body import ClientDisconnected, read_body
from lore_gateway.channel import ClientChannel, Receive, Send
from lore_gateway.config import Settings
from lore_gateway.errors import GatewayError, error_body
from lore_gateway.headers import header_map
from lore_gateway.memory.store.records import Identity
from lore_gateway.storage.errors import MemoryUnavailable

if TYPE_CHECKING:
    from lore_gateway.memory.service import Memory

LOCAL_RECALL_PATH = "/lore/recall"
# A recall request is a query and a few options.
MAX_REQUEST_BYTES = 64 * 1024
MAX_LIMIT = 50
SCOPES = ("session", "project", "all")


def database_name(settings: Settings) -> str:
    """How ``lore recall`` and the gateway check they share a database: the SQLite
    file's resolved path, or the Postgres URL without its password."""
    database = settings.database
    return str(settings.db_path.resolve()) if database.backend == "sqlite" else database.url


def is_loopback(client: Any) -> bool:
    """Whether the ASGI ``client`` (host, port) is a loopback address."""
    if not client:
        return False
    try:
        return ipaddress.ip_address(str(client[0]).split("%")[0]).is_loopback
    except ValueError:
        return False


async def handle(scope: dict[str, Any], receive: Receive, send: Send, memory: Memory | None) -> int:
    """Serve one local recall request; the status sent."""
    channel = ClientChannel(send)
    try:
        status, body = await _answer(scope, receive, memory)
    except GatewayError as exc:
        status, body = exc.status, exc.body()
    except MemoryUnavailable as exc:  # the database or the search process is gone
        status, body = 503, error_body("api_error", f"memory cannot answer now: {exc}")
    except ClientDisconnected:
        return 0
    await channel.respond(status, body)
    return status


async def _answer(scope: dict[str, Any], receive: Receive,
                  memory: Memory | None) -> tuple[int, bytes]:
    if not is_loopback(scope.get("client")):
        return 403, error_body("permission_error",
                               f"{LOCAL_RECALL_PATH} answers loopback clients only")
    if scope["method"] != "POST":
        return 405, error_body("invalid_request_error", f"use POST {LOCAL_RECALL_PATH}")
    if memory is None:
        return 503, error_body("api_error", "this gateway stores no memory (LORE_STORE=false)")
    headers = header_map(scope["headers"])
    raw = await read_body(receive, limit=MAX_REQUEST_BYTES,
                          content_length=headers.get("content-length"))
    request = _parse(raw)
    named = str(request.get("db", ""))
    if named != database_name(memory.settings) and not _same_database(named,
                                                                      memory.database.url):
        return 409, error_body("invalid_request_error",
                               "this gateway serves another database; search it locally")
    tenant = memory.tenancy.tenant(headers)  # 401 in team mode without a valid key
    identity = Identity(tenant, request["project"], request["session"])
    result = await memory.search(request["query"], identity=identity, scope=request["scope"],
                                 limit=request["limit"])
    rendered = await asyncio.to_thread(memory.render, result)
    return 200, orjson.dumps({
        "query": result.query, "scope": request["scope"], "tenants": [tenant],
        "total": result.total, "rendered": rendered,
        "hits": [{"ref": h.ref, "score": round(h.score, 4), "role": h.role,
                  "content": h.content, "created_at": h.created_at, "session": h.session,
                  "project": h.project, "folded": list(h.folded),
                  "superseded_by": h.superseded_by} for h in result.hits],
    })


def _same_database(named: str, served: str) -> bool:
    """Whether the caller's database (a URL, or the path of a SQLite file as older
    CLIs send it) is the one this gateway serves."""
    if named == served:
        return True
    from lore_gateway.storage.target import parse_url

    try:
        return named != "" and parse_url(named).url == served
    except ValueError:
        return False


def _parse(raw: bytes) -> dict[str, Any]:
    try:
        request = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise GatewayError(400, "invalid_request_error", f"Invalid JSON body: {exc}") from None
    if not isinstance(request, dict):
        raise GatewayError(400, "invalid_request_error", "expected a JSON object")
    query, scope, limit = request.get("query"), request.get("scope", "all"), request.get("limit")
    if not isinstance(query, str) or not query.strip():
        raise GatewayError(400, "invalid_request_error", '"query" must be a non-empty string')
    if scope not in SCOPES:
        raise GatewayError(400, "invalid_request_error",
                           f'"scope" must be one of {", ".join(SCOPES)}')
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MAX_LIMIT:
        limit = 10
    project, session = request.get("project"), request.get("session")
    return {**request, "query": query, "scope": scope, "limit": limit,
            "project": project if isinstance(project, str) else "",
            "session": session if isinstance(session, str) else ""}
