"""The route table: which requests the gateway serves and where they go upstream.

Pure data and one lookup function, so every routing decision is a unit test.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class Protocol(StrEnum):
    """The wire protocol of a model route, as the upstream speaks it."""

    RESPONSES = "responses"  # OpenAI Responses, public API
    CODEX = "codex"  # OpenAI Responses, ChatGPT Codex backend (stream-only, lenient)
    CHAT = "chat"  # OpenAI Chat Completions
    ANTHROPIC = "anthropic"  # Anthropic Messages
    GEMINI = "gemini"  # Google Gemini generateContent / streamGenerateContent


class Family(StrEnum):
    """The wire-format family of a protocol: what the recall tool, its anchors and
    their expansion speak. The Codex backend speaks Responses."""

    RESPONSES = "responses"
    CHAT = "chat"
    ANTHROPIC = "anthropic"
    GEMINI = "gemini"


# The one Protocol → Family mapping (every other module asks ``protocol.family``).
FAMILIES: dict[Protocol, Family] = {
    Protocol.RESPONSES: Family.RESPONSES,
    Protocol.CODEX: Family.RESPONSES,
    Protocol.CHAT: Family.CHAT,
    Protocol.ANTHROPIC: Family.ANTHROPIC,
    Protocol.GEMINI: Family.GEMINI,
}


def family_of(protocol: Protocol) -> Family:
    return FAMILIES[protocol]


class Upstream(StrEnum):
    OPENAI = "openai"
    CHATGPT = "chatgpt"
    ANTHROPIC = "anthropic"
    GEMINI = "gemini"


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
    # Whether the answer streams when the path says so (Gemini's
    # ``:streamGenerateContent`` streams, ``:generateContent`` does not); None: the
    # body's ``stream`` field says (OpenAI, Anthropic).
    stream: bool | None = None
    # The model when the path names it (Gemini: ``models/{model}:…``), else "".
    model: str = ""

    def streams(self, payload: Mapping[str, Any]) -> bool:
        """Whether the answer to ``payload`` on this route is a stream."""
        return self.stream if self.stream is not None else payload.get("stream") is True


RESPONSES_PATHS = frozenset(
    {"/v1/responses", "/backend-api/codex/responses", "/v1/codex/responses"}
)
_CODEX_PATHS = frozenset({"/backend-api/codex/responses", "/v1/codex/responses"})
_CHAT_PATHS = frozenset({"/v1/chat/completions", "/chat/completions"})
# Gemini names the model and the method in the path: ``/v1beta/models/{model}:
# generateContent`` (and ``/v1/``, which newer SDKs call). Model names are
# letters, digits, dots, dashes and underscores.
_GEMINI_METHOD = re.compile(
    r"^/(v1beta|v1)/models/([A-Za-z0-9._-]+):(generateContent|streamGenerateContent|countTokens)$")
_GEMINI_PREFIXES = ("/v1beta/", "/v1alpha/")


def _gemini(path: str, suffix: str) -> Route | None:
    """The route of a Gemini model method, or None for any other path."""
    found = _GEMINI_METHOD.match(path)
    if found is None:
        return None
    model, method = found.group(2), found.group(3)
    if method == "countTokens":
        return Route(Kind.JSON, Upstream.GEMINI, path + suffix, model=model)
    return Route(Kind.MODEL, Upstream.GEMINI, path + suffix, Protocol.GEMINI,
                 stream=method == "streamGenerateContent", model=model)


def is_google_key_query(query: str) -> bool:
    """A query string carrying a Gemini API key (``?key=``)."""
    return any(part.startswith("key=") for part in query.split("&"))


def match(
    method: str, path: str, query: str, *, anthropic_version: bool, upgrade: bool,
    google_key: bool = False,
) -> Route | None:
    """Find the route for a request, or None when nothing serves it.

    ``anthropic_version`` says whether the request carries an ``anthropic-version``
    header and ``google_key`` whether it carries ``x-goog-api-key`` (or the query
    a ``key=``): they decide where generic ``/v1/*`` passthrough goes;
    ``upgrade`` whether it asks for a WebSocket upgrade.
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
        gemini = _gemini(path, suffix)
        if gemini is not None:
            return gemini
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
    if path.startswith(_GEMINI_PREFIXES):
        return Route(Kind.PASSTHROUGH, Upstream.GEMINI, path + suffix)
    if path.startswith("/v1/"):
        if (google_key or is_google_key_query(query)
                or (path.startswith("/v1/models/") and ":" in path)):
            return Route(Kind.PASSTHROUGH, Upstream.GEMINI, path + suffix)
        upstream = Upstream.ANTHROPIC if anthropic_version else Upstream.OPENAI
        return Route(Kind.PASSTHROUGH, upstream, path + suffix)
    return None
