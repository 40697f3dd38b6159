"""The floor of ``lore bench overhead``: a bare streaming relay.

A minimal aiohttp passthrough, a measurement baseline and never a product path:
no parsing, no storage, no routing beyond the upstream's base URL. It forwards
the method, path, headers and body, then relays the response body chunk by chunk
as it arrives. What the gateway costs above *this* is what its memory work costs;
what this costs above the fake upstream is what any Python proxy costs.

Run by the benchmark as a separate process (as the gateway is)::

    python -m lore_gateway.bench.relay --port 18082 --upstream http://127.0.0.1:18081
"""

from __future__ import annotations

import argparse
import asyncio
import socket

import aiohttp
from aiohttp import web
from aiohttp.web_protocol import RequestHandler

# Hop-by-hop headers (RFC 9110 §7.6.1) plus the ones aiohttp sets itself.
_DROP = frozenset({"connection", "keep-alive", "transfer-encoding", "te", "trailer",
                   "upgrade", "proxy-connection", "host", "content-length"})


class _NoDelayServer(web.Server):
    """TCP_NODELAY on accepted sockets, as the gateway and the fake have."""

    def connection_made(self, handler: RequestHandler, transport: asyncio.Transport) -> None:
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        super().connection_made(handler, transport)


class Relay:
    """One pooled client session to the upstream; one handler for every request."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.session: aiohttp.ClientSession | None = None

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        assert self.session is not None
        body = await request.read()
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in _DROP]
        async with self.session.request(request.method, self.upstream + request.path_qs,
                                        headers=headers, data=body or None,
                                        allow_redirects=False) as upstream:
            out = web.StreamResponse(status=upstream.status, headers={
                k: v for k, v in upstream.headers.items() if k.lower() not in _DROP})
            await out.prepare(request)
            async for chunk in upstream.content.iter_any():
                await out.write(chunk)
            await out.write_eof()
            return out


async def serve(host: str, port: int, upstream: str) -> None:
    relay = Relay(upstream)
    relay.session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=512),
        timeout=aiohttp.ClientTimeout(total=None), auto_decompress=False,
        skip_auto_headers=("Content-Type",))
    server = _NoDelayServer(relay.handle)
    loop = asyncio.get_running_loop()
    listener = await loop.create_server(server, host, port, reuse_address=True)
    try:
        await asyncio.Event().wait()
    finally:
        listener.close()
        await relay.session.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="A bare streaming relay (benchmark floor).")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="Base URL to forward to.")
    args = parser.parse_args(argv)
    asyncio.run(serve(args.host, args.port, args.upstream))


if __name__ == "__main__":
    main()
