"""``/mcp``: the memory tools over MCP's streamable HTTP, on the gateway's own port.

Who may call is decided as for /ui (``ui/auth.py``), before the SDK sees the
request:

* **personal mode on a loopback bind** (the default): loopback clients only, and
  the SDK's DNS-rebinding check refuses a ``Host`` or ``Origin`` that is not this
  machine, so a web page elsewhere cannot reach it through the browser;
* **team mode** (``LORE_TENANCY=keys``): a valid gateway key in ``X-Lore-Key``
  (401 without one, the same message as a model request's), and the key's
  tenant is the only memory any tool sees;
* **personal mode on another bind**: any live gateway key, for the one memory.

The tenant (and the ``X-Lore-Project`` header, the project a call means when it
names none) travel to the tools in the request's ASGI ``state``; every tool
reads that request's own, so a key sees its own memory whichever MCP session
the request names.

The SDK serves in stateless JSON mode: each POST is one JSON-RPC exchange, no
MCP session or stream outlives its request (the tools never call back into the
client), so nothing is kept per client. Its session manager needs a task group
for the gateway's life; it, and the SDK itself, are started by the first /mcp
request, so a gateway nobody asks for MCP never imports the SDK.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import orjson

from lore_gateway.channel import ClientChannel, Receive, Send
from lore_gateway.config import Settings
from lore_gateway.errors import GatewayError
from lore_gateway.headers import header_map
from lore_gateway.mcp_server.tools import Caller, MemoryTools
from lore_gateway.memory.service import Memory
from lore_gateway.memory.tenancy import keys
from lore_gateway.memory.tenancy.identity import (
    INVALID_KEY_MESSAGE,
    MISSING_KEY_MESSAGE,
    PERSONAL,
    project_for,
)
from lore_gateway.obs.status import is_loopback
from lore_gateway.recall.core.executor import SearchGate
from lore_gateway.ui.auth import bind_is_loopback

if TYPE_CHECKING:
    from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

MCP_PATH = "/mcp"
# JSON-RPC 2.0's "Invalid Request" error code.
INVALID_REQUEST = -32600
# Where the resolved caller rides in the ASGI scope's ``state`` (Starlette's
# ``request.state``, which the SDK hands the tools as ``ctx.request_context.request``).
CALLER_STATE = "lore_mcp_caller"
# The SDK's DNS-rebinding check on a loopback bind: this machine's names, any port.
LOCAL_HOSTS = ("127.0.0.1", "localhost", "[::1]")
# Largest request body: a tool call is a few KiB (knowledge content is capped at
# 1,200 characters); the SDK's default is 4 MiB.
MAX_REQUEST_BYTES = 256 * 1024

LOOPBACK_ONLY = ("/mcp answers this machine only. Connect from the gateway's machine, or run "
                 "the gateway in team mode (LORE_TENANCY=keys) and send a gateway key in "
                 "X-Lore-Key.")


class McpEndpoint:
    """The ``/mcp`` route of one gateway (see the module docstring)."""

    def __init__(self, settings: Settings, memory: Memory | None) -> None:
        self._settings = settings
        self._memory = memory
        self._team = settings.tenancy == "keys"
        self._needs_key = self._team or not bind_is_loopback(settings.host)
        self._manager: StreamableHTTPSessionManager | None = None
        self._serving: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self._starting = asyncio.Lock()

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> int:
        """Serve one /mcp request; the status sent."""
        channel = ClientChannel(send)
        memory = self._memory
        if memory is None:
            await channel.respond(503, refusal("this gateway stores no memory (LORE_STORE="
                                               "false), so /mcp has nothing to serve"))
            return 503
        try:
            tenant = await self._tenant(scope, memory)
        except GatewayError as exc:
            await channel.respond(exc.status, refusal(exc.message))
            return exc.status
        headers = header_map(scope["headers"])
        project = project_for(headers, {}) if headers.get("x-lore-project", "").strip() else None
        state = {**scope.get("state", {}), CALLER_STATE: Caller(tenant, project)}
        manager = await self._running(memory)
        status = 0

        async def watched(message: Any) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        await manager.handle_request({**scope, "state": state}, receive, watched)
        return status

    async def _tenant(self, scope: dict[str, Any], memory: Memory) -> str:
        """Whose memory this request may see; ``GatewayError`` (401, 403) when none."""
        if not self._needs_key:
            if not is_loopback(scope):
                raise GatewayError(403, "permission_error", LOOPBACK_ONLY, retry=False)
            return PERSONAL
        headers = header_map(scope["headers"])
        if self._team:
            return memory.tenancy.tenant(headers)  # the key ring: never blocks
        key = headers.get(keys.KEY_HEADER, "").strip()
        if not key:
            raise GatewayError(401, "authentication_error", MISSING_KEY_MESSAGE, retry=False)
        if await asyncio.to_thread(memory.read, lambda c: keys.tenant_of(c, key)) is None:
            raise GatewayError(401, "authentication_error", INVALID_KEY_MESSAGE, retry=False)
        return PERSONAL

    async def _running(self, memory: Memory) -> StreamableHTTPSessionManager:
        """The SDK's session manager, built and started on first use."""
        if self._manager is not None:
            return self._manager
        async with self._starting:
            if self._manager is None:
                # Importing and building the SDK's server takes a while: off the loop.
                manager = await asyncio.to_thread(self._build, memory)
                ready = asyncio.Event()
                self._serving = asyncio.create_task(self._serve(manager, ready),
                                                    name="lore-mcp")
                waiting = asyncio.ensure_future(ready.wait())
                await asyncio.wait({self._serving, waiting},
                                   return_when=asyncio.FIRST_COMPLETED)
                if self._serving.done():
                    waiting.cancel()
                    self._serving.result()  # its exception, if it failed to start
                self._manager = manager
        return self._manager

    def _build(self, memory: Memory) -> StreamableHTTPSessionManager:
        from mcp.server.transport_security import TransportSecuritySettings

        from lore_gateway.mcp_server import server

        tools = MemoryTools(memory, export=self._settings.export,
                            gate=SearchGate(timeout=self._settings.search_timeout))
        mcp = server.build(tools, _request_caller)
        security = TransportSecuritySettings(enable_dns_rebinding_protection=False)
        if not self._needs_key:
            security = TransportSecuritySettings(
                allowed_hosts=[h for host in LOCAL_HOSTS for h in (host, f"{host}:*")],
                allowed_origins=[o for host in LOCAL_HOSTS
                                 for o in (f"http://{host}", f"http://{host}:*")])
        mcp.streamable_http_app(streamable_http_path=MCP_PATH, stateless_http=True,
                                json_response=True, transport_security=security,
                                max_request_body_size=MAX_REQUEST_BYTES)
        return mcp.session_manager

    async def _serve(self, manager: StreamableHTTPSessionManager, ready: asyncio.Event) -> None:
        async with manager.run():
            ready.set()
            await self._stop.wait()

    async def close(self) -> None:
        """Stop the session manager (after the server stopped taking requests)."""
        self._stop.set()
        if self._serving is not None:
            # gather, not a suppressed await: a cancel of close itself still ends it.
            (ended,) = await asyncio.gather(self._serving, return_exceptions=True)
            if isinstance(ended, Exception):
                raise ended


def refusal(message: str) -> bytes:
    """A refusal as a JSON-RPC error (no request id: the request was not read), which
    MCP clients show their user, where a gateway error body would be "Server returned
    an error response". The code is the one the SDK gives its own HTTP refusals."""
    return orjson.dumps({"jsonrpc": "2.0", "id": None,
                         "error": {"code": INVALID_REQUEST, "message": message}})


async def _request_caller(ctx: Any) -> Caller:
    """The caller ``McpEndpoint`` resolved for this very request."""
    caller: Caller = ctx.request_context.request.scope["state"][CALLER_STATE]
    return caller
