"""The upstream client layer: pooled HTTP connections to the providers.

One aiohttp session (connection pool) serves all upstreams. This layer knows
nothing of protocols: it sends bytes and hands back a response whose body can be
read whole (bounded) or chunk by chunk as it arrives. aiohttp was measured at
about half the added latency of httpx for SSE relaying on a 2-core machine
(peers-and-stack.md §3.1).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp

from lore_gateway.config import Settings
from lore_gateway.routing import Upstream


class UpstreamUnavailable(Exception):
    """The upstream could not be reached, or the connection failed before a response."""


class UpstreamDisconnected(UpstreamUnavailable):
    """The upstream accepted the connection, then closed it before any response."""


class UpstreamBroken(Exception):
    """The upstream connection failed while the response body was being read."""


_READ_ERRORS = (aiohttp.ClientError, TimeoutError, OSError)


@dataclass(slots=True)
class UpstreamResponse:
    """A response whose headers have arrived; the body is read on demand."""

    status: int
    raw_headers: list[tuple[bytes, bytes]]
    content_type: str
    _resp: aiohttp.ClientResponse

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives (already decoded from any Content-Encoding)."""
        try:
            async for chunk in self._resp.content.iter_any():
                yield chunk
        except _READ_ERRORS as exc:
            raise UpstreamBroken(_describe(exc)) from exc

    async def read(self, limit: int) -> tuple[bytes, bool]:
        """The body, at most ``limit`` bytes; the flag says whether it was cut."""
        buf = bytearray()
        async for chunk in self.chunks():
            buf += chunk
            if len(buf) > limit:
                del buf[limit:]
                return bytes(buf), True
        return bytes(buf), False

    def close(self) -> None:
        """Release the connection; an unfinished body closes it (cancels upstream)."""
        self._resp.close()


class UpstreamClient:
    """Sends requests to the configured upstream base URLs."""

    def __init__(self, settings: Settings) -> None:
        self._bases = {
            Upstream.OPENAI: settings.upstream_openai,
            Upstream.CHATGPT: settings.upstream_chatgpt,
            Upstream.ANTHROPIC: settings.upstream_anthropic,
        }
        self._connect_timeout = settings.upstream_connect_timeout
        self._read_timeout = settings.upstream_read_timeout
        self._session: aiohttp.ClientSession | None = None

    def url(self, upstream: Upstream, path: str) -> str:
        return self._bases[upstream] + path

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(limit=512, ttl_dns_cache=300)
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(
                total=None, sock_connect=self._connect_timeout, sock_read=self._read_timeout
            ),
            auto_decompress=True,
            skip_auto_headers=("Content-Type",),
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def send(
        self, method: str, url: str, headers: list[tuple[str, str]], body: bytes | None
    ) -> UpstreamResponse:
        """Send a request; return once the response headers arrived."""
        assert self._session is not None, "UpstreamClient.start() was not called"
        try:
            resp = await self._session.request(
                method, url, headers=headers, data=body, allow_redirects=False
            )
        except aiohttp.ServerDisconnectedError as exc:
            raise UpstreamDisconnected(_describe(exc)) from exc
        except _READ_ERRORS as exc:
            raise UpstreamUnavailable(_describe(exc)) from exc
        return UpstreamResponse(
            status=resp.status,
            raw_headers=list(resp.raw_headers),
            content_type=resp.headers.get("content-type", ""),
            _resp=resp,
        )


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
