"""The route table: which requests the gateway serves and where they go upstream.

Pure data and one lookup function, so every routing decision is a unit test.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Protocol(StrEnum):
    """The wire protocol of a model route, as the upstream speaks it."""

    RESPONSES = "responses"  # OpenAI Responses, public API
    CODEX = "codex"  # OpenAI Responses, ChatGPT Codex backend (stream-only, lenient)
    CHAT = "chat"  # OpenAI Chat Completions
    ANTHROPIC = "anthropic"  # Anthropic Messages


class Family(StrEnum):
    """The wire-format family of a protocol: what the recall tool, its anchors and
    their expansion speak. The Codex backend speaks Responses."""

    RESPONSES = "responses"
    CHAT = "chat"
    ANTHROPIC = "anthropic"


# The one Protocol → Family mapping (every other module asks ``protocol.family``).
FAMILIES: dict[Protocol, Family] = {
    Protocol.RESPONSES: Family.RESPONSES,
    Protocol.CODEX: Family.RESPONSES,
    Protocol.CHAT: Family.CHAT,
    Protocol.ANTHROPIC: Family.ANTHROPIC,
}


def family_of(protocol: Protocol) -> Family:
    return FAMILIES[protocol]


class Upstream(StrEnum):
    OPENAI = "openai"
    CHATGPT = "chatgpt"
    ANTHROPIC = "anthropic"


class Kind(StrEnum):
    MODEL = "model"  # a conversation turn: parsed, stored, recall-capable
    COMPACT = "compact"  # Codex's POST …/responses/compact: answered from memory
    JSON = "json"  # a JSON request forwarded as is (count_tokens)
    PASSTHROUGH = "passthrough"  # any other /v1/* request, bytes in, bytes out
    HEALTH = "health"
    METRICS = "metrics"
    STATUS = "status"  # lore status: loopback-only JSON (obs/status.py)
    UI = "ui"  # the memory browser under /ui (ui/app.py)
    MCP = "mcp"  # the memory as an MCP server, streamable HTTP (mcp_server/http.py)
    WEBSOCKET_REFUSED = "websocket_refused"


@dataclass(frozen=True, slots=True)
class Route:
    kind: Kind
    upstream: Upstream | None = None
    # Path appended to the upstream base URL, query string included.
    upstream_path: str = ""
    protocol: Protocol | None = None


RESPONSES_PATHS = frozenset(
    {"/v1/responses", "/backend-api/codex/responses", "/v1/codex/responses"}
)
_CODEX_PATHS = frozenset({"/backend-api/codex/responses", "/v1/codex/responses"})
_CHAT_PATHS = frozenset({"/v1/chat/completions", "/chat/completions"})


def match(
    method: str, path: str, query: str, *, anthropic_version: bool, upgrade: bool
) -> Route | None:
    """Find the route for a request, or None when nothing serves it.

    ``anthropic_version`` says whether the request carries an ``anthropic-version``
    header (it decides where generic ``/v1/*`` passthrough goes); ``upgrade``
    whether it asks for a WebSocket upgrade.
    """
    suffix = f"?{query}" if query else ""
    if upgrade and path in RESPONSES_PATHS:
        # Codex tries WebSocket first; a 426 makes it fall back to HTTP at once,
        # where a 404 costs it five retries.
        return Route(Kind.WEBSOCKET_REFUSED)
    if method == "POST":
        if path == "/v1/responses/compact":
            return Route(Kind.COMPACT, Upstream.OPENAI, path + suffix, Protocol.RESPONSES)
        if path.removesuffix("/compact") in _CODEX_PATHS and path.endswith("/compact"):
            return Route(Kind.COMPACT, Upstream.CHATGPT, "/codex/responses/compact" + suffix,
                         Protocol.CODEX)
        if path == "/v1/responses":
            return Route(Kind.MODEL, Upstream.OPENAI, "/v1/responses" + suffix, Protocol.RESPONSES)
        if path in _CODEX_PATHS:
            return Route(Kind.MODEL, Upstream.CHATGPT, "/codex/responses" + suffix, Protocol.CODEX)
        if path in _CHAT_PATHS:
            return Route(
                Kind.MODEL, Upstream.OPENAI, "/v1/chat/completions" + suffix, Protocol.CHAT
            )
        if path == "/v1/messages":
            return Route(
                Kind.MODEL, Upstream.ANTHROPIC, "/v1/messages" + suffix, Protocol.ANTHROPIC
            )
        if path == "/v1/messages/count_tokens":
            return Route(Kind.JSON, Upstream.ANTHROPIC, path + suffix)
    if (method == "HEAD" and path == "/") or (method in ("GET", "HEAD") and path == "/health"):
        return Route(Kind.HEALTH)
    if method == "GET" and path == "/metrics":
        return Route(Kind.METRICS)
    if method == "GET" and path == "/lore/status":
        return Route(Kind.STATUS)
    if path == "/ui" or path.startswith("/ui/"):
        return Route(Kind.UI)
    if path in ("/mcp", "/mcp/"):
        return Route(Kind.MCP)
    if path.startswith("/v1/"):
        upstream = Upstream.ANTHROPIC if anthropic_version else Upstream.OPENAI
        return Route(Kind.PASSTHROUGH, upstream, path + suffix)
    return None
