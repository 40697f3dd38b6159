"""The small HTTP layer under the pages: a parsed request and the responses.

Plain ASGI like the rest of the gateway: the pages need query strings, small
urlencoded forms, cookies, redirects and one streaming kind (SSE), and nothing a
framework would add is worth a second request model on the data plane.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, quote

from lore_gateway.channel import Receive, Send


class NotFound(Exception):
    """A page or record that is not there: a 404 page with ``hint`` under it."""

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.hint = hint

# Largest form a page posts (a knowledge entry is at most a few KiB).
MAX_FORM_BYTES = 64 * 1024

# Pages load nothing from elsewhere and run only our own scripts. uPlot sizes its
# canvas through style attributes, hence 'unsafe-inline' for styles only.
SECURITY_HEADERS: list[tuple[bytes, bytes]] = [
    (b"content-security-policy", b"default-src 'self'; script-src 'self'; "
     b"style-src 'self' 'unsafe-inline'; img-src 'self' data:; frame-ancestors 'none'; "
     b"form-action 'self'; base-uri 'none'"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
]


class FormTooLarge(Exception):
    pass


@dataclass(slots=True)
class Request:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    scope: dict[str, Any]

    @classmethod
    def from_scope(cls, scope: dict[str, Any]) -> Request:
        raw = scope.get("query_string", b"").decode("latin-1")
        query = {k: v[0] for k, v in parse_qs(raw, keep_blank_values=True).items()}
        headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                   for k, v in scope.get("headers", [])}
        return cls(scope["method"], scope["path"], query, headers, scope)

    def arg(self, name: str, default: str = "") -> str:
        return self.query.get(name, default)

    def int_arg(self, name: str, default: int = 0, *, low: int = 0,
                high: int = 1_000_000) -> int:
        value = self.query.get(name, "")
        return max(low, min(int(value), high)) if value.isdigit() else default

    @property
    def wants_fragment(self) -> bool:
        """htmx asks for a part of a page (``HX-Request``), not the whole page."""
        return self.headers.get("hx-request") == "true"


async def read_form(receive: Receive) -> dict[str, str]:
    """A urlencoded form body, bounded by :data:`MAX_FORM_BYTES`."""
    body = bytearray()
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        body += message.get("body", b"")
        if len(body) > MAX_FORM_BYTES:
            raise FormTooLarge
        if not message.get("more_body", False):
            break
    parsed = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)
    return {k: v[0] for k, v in parsed.items()}


async def respond(send: Send, status: int, body: bytes, content_type: str = "text/html",
                  extra: list[tuple[bytes, bytes]] | None = None, *,
                  cache: bool = False) -> None:
    headers = [(b"content-type", f"{content_type}; charset=utf-8".encode()
                if content_type.startswith("text/") or content_type.endswith("json")
                else content_type.encode()),
               (b"content-length", str(len(body)).encode()),
               (b"cache-control", b"public, max-age=3600" if cache else b"no-store"),
               *SECURITY_HEADERS, *(extra or [])]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def redirect(send: Send, location: str,
                   extra: list[tuple[bytes, bytes]] | None = None) -> None:
    headers = [(b"location", quote(location, safe="/?=&%:#+").encode()), *(extra or [])]
    await respond(send, 303, b"", "text/plain", headers)
