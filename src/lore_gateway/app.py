"""The ASGI application: a table of routes to handlers.

Plain ASGI, no framework on the data plane: each request is routed once
(``routing.match``) and handed to one handler that reads top to bottom.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Callable
from time import perf_counter
from typing import Any

import orjson

from lore_gateway import __version__, local_recall
from lore_gateway.channel import ClientChannel, Receive, Send
from lore_gateway.errors import error_body
from lore_gateway.mcp_server.http import McpEndpoint
from lore_gateway.obs import metrics
from lore_gateway.obs import status as status_route
from lore_gateway.obs.logging import bind_request
from lore_gateway.proxy import Proxy
from lore_gateway.routing import Kind, Route, match
from lore_gateway.ui.app import UiApp

log = logging.getLogger("lore.app")

_HEALTH_BODY = orjson.dumps({"status": "ok", "version": __version__})


def health_body(degraded: str | None) -> bytes:
    """``/health``: ``ok``, or ``degraded`` with the reason memory is not working.

    Still 200 when degraded: the gateway forwards traffic either way, and a
    launcher probing it must not start a second one. ``lore status`` reads
    ``memory`` and ``reason``.
    """
    if degraded is None:
        return _HEALTH_BODY
    return orjson.dumps({"status": "degraded", "version": __version__,
                         "memory": "degraded", "reason": degraded})


class GatewayApp:
    def __init__(self, proxy: Proxy,
                 memory_degraded: Callable[[], str | None] = lambda: None) -> None:
        self.proxy = proxy
        self.live = status_route.Live(memory=proxy.turns.memory,
                                      recall_active=proxy.recall is not None)
        self._memory_degraded = memory_degraded
        self.ui = UiApp(proxy.settings, proxy.turns.memory, self.live, proxy.turns.amnesia)
        self.mcp = McpEndpoint(proxy.settings, proxy.turns.memory)

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        bind_request()
        started = perf_counter()
        method: str = scope["method"]
        path: str = scope["path"]
        if path == local_recall.LOCAL_RECALL_PATH:  # `lore recall` asking the warm gateway
            status = await local_recall.handle(scope, receive, send, self.proxy.turns.memory)
            metrics.record_request("local_recall", status, "", None, None)
            return
        headers: list[tuple[bytes, bytes]] = scope["headers"]
        anthropic_version = upgrade = google_key = False
        for name, value in headers:
            lower = name.lower()
            if lower == b"anthropic-version":
                anthropic_version = True
            elif lower == b"x-goog-api-key":
                google_key = True
            elif lower == b"upgrade" and value.lower() == b"websocket":
                upgrade = True
        problem = path_problem(path, scope.get("raw_path") or b"")
        if problem is not None:
            await ClientChannel(send).respond(400, error_body("invalid_request_error", problem))
            metrics.record_request("rejected", 400, "", None, None)
            return
        query = scope.get("query_string", b"").decode("latin-1")
        route = match(method, path, query, anthropic_version=anthropic_version, upgrade=upgrade,
                      google_key=google_key)
        if route is not None and route.kind is Kind.PASSTHROUGH:
            # Forward the path as the client wrote it: the decoded form would turn
            # an escaped '?' or '#' into a query or fragment upstream.
            raw = (scope.get("raw_path") or path.encode()).decode("latin-1")
            route = dataclasses.replace(
                route, upstream_path=raw + (f"?{query}" if query else ""))
        if route is None and method == "GET" and path == "/":
            # A person opening the gateway's address in a browser: the memory browser.
            await ClientChannel(send).respond(302, b"", [(b"location", b"/ui")])
            metrics.record_request("unmatched", 302, "", None, None)
            return
        if route is None:
            await ClientChannel(send).respond(
                404, error_body("not_found", f"No route for {method} {path}")
            )
            metrics.record_request("unmatched", 404, "", None, None)
            return
        await self._dispatch(route, scope, receive, send, path, started)

    async def _dispatch(self, route: Route, scope: dict[str, Any], receive: Receive, send: Send,
                        path: str, started: float) -> None:
        kind = route.kind
        if kind is Kind.MODEL:
            timing = await self.proxy.handle_model(scope, receive, send, route)
            protocol = route.protocol.value if route.protocol else ""
            overhead = timing.overhead(perf_counter() - started)
            metrics.record_request(path, timing.status, protocol, overhead, timing.ttfb)
            if log.isEnabledFor(logging.INFO):  # the arguments cost more than the check
                log.info("%s %s %s protocol=%s overhead_ms=%s ttfb_ms=%s", scope["method"],
                         path, timing.status, protocol, _ms(overhead), _ms(timing.ttfb))
            return
        if kind is Kind.COMPACT:
            status = await self.proxy.handle_compact(scope, receive, send, route)
            metrics.record_request("compact", status, route.protocol or "", None, None)
            return
        if kind is Kind.PASSTHROUGH or kind is Kind.JSON:
            status = await self.proxy.handle_passthrough(scope, receive, send, route)
            metrics.record_request("passthrough", status, "", None, None)
            return
        if kind is Kind.UI:
            await self.ui(scope, receive, send)
            return
        if kind is Kind.MCP:
            metrics.record_request("mcp", await self.mcp(scope, receive, send), "", None, None)
            return
        client = ClientChannel(send)
        if kind is Kind.HEALTH:
            await client.respond(200, health_body(self._memory_degraded()),
                                 head=scope["method"] == "HEAD")
        elif kind is Kind.METRICS:
            body, content_type = metrics.render()
            await client.respond(200, body, [(b"content-type", content_type.encode())])
        elif kind is Kind.STATUS:
            await status_route.respond(scope, client, self.proxy.settings, self.live)
        elif kind is Kind.WEBSOCKET_REFUSED:
            await client.respond(
                426,
                error_body(
                    "websocket_not_supported",
                    f"WebSocket transport is not supported for {path}; use HTTP.",
                ),
                [(b"content-type", b"application/json"), (b"connection", b"close")],
            )
        metrics.record_request(kind.value, client.status, "", None, None)


# Encoded forms that would let a decoded path differ from the one checked: a
# slash or backslash inside a segment, and '%' itself (double encoding).
_ENCODED_SEPARATORS = (b"%2f", b"%5c", b"%25", b"%00")
_BACKSLASH_OR_CONTROL = re.compile(r"[\\\x00-\x1f\x7f]")


def path_problem(path: str, raw_path: bytes) -> str | None:
    """Why ``path`` must not be forwarded, or None when it may.

    Pass-through routes append the client's path to the upstream's base URL
    with the client's credentials, so ``/v1/../../etc/passwd`` (as is, or as
    ``%2e%2e``) would leave ``/v1/`` upstream. Dot segments, encoded separators,
    backslashes and control characters are refused on every route.
    """
    segments = path.split("/")
    if "." in segments or ".." in segments:
        return (f"Invalid path {path[:200]!r}: '.' and '..' segments are not allowed; "
                "send the normalised path.")
    if _BACKSLASH_OR_CONTROL.search(path):
        return "Invalid path: backslashes and control characters are not allowed."
    if b"%" in raw_path and any(code in raw_path.lower() for code in _ENCODED_SEPARATORS):
        return "Invalid path: encoded '/', '\\', '%' or NUL are not allowed in the path."
    return None


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.2f}"


async def _lifespan(receive: Receive, send: Send) -> None:
    """Resources are owned by ``server.Gateway``; the lifespan protocol is acknowledged."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
