"""Which headers cross the gateway, in each direction.

Headers are forwarded as they came, except those that describe one hop of the
connection (RFC 9110 §7.6.1), the body's framing or encoding (the gateway
re-frames and decodes bodies), and the gateway's own ``x-lore-*`` controls.
Credentials are forwarded to the upstream and nowhere else; ``is_credential``
lets logging and storage refuse them.
"""

from __future__ import annotations

from collections.abc import Iterable

RawHeaders = list[tuple[bytes, bytes]]

_HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
    }
)

# Request headers the gateway never forwards upstream. ``host`` is the upstream's;
# length and encoding describe the body as received (it is decoded and may change);
# ``accept-encoding`` is left to the upstream client, which decodes what it asks for.
_REQUEST_DROP = _HOP_BY_HOP | {b"host", b"content-length", b"content-encoding", b"accept-encoding"}

# Response headers the gateway never relays: the body is re-framed (length,
# chunking) and arrives decoded from the upstream client.
_RESPONSE_DROP = _HOP_BY_HOP | {b"content-length", b"content-encoding"}

# The one list of names whose value is a credential, whatever it looks like (an
# account id is a plain UUID, so only its name gives it away): header names, and
# the keys a log field or a config/JSON object may carry them under. Logging
# redacts by it (``obs.logging``); compared lower-case, with '_' read as '-'.
CREDENTIAL_NAMES = frozenset(
    {
        "authorization",
        "proxy-authorization",
        "x-api-key",
        "x-goog-api-key",
        "api-key",
        "apikey",
        "chatgpt-account-id",
        "account-id",
        "openai-organization",
        "openai-project",
        "cookie",
        "set-cookie",
        "x-lore-key",
        "token",
        "access-token",
        "refresh-token",
        "id-token",
        "password",
        "secret",
        "openai-api-key",
        "anthropic-api-key",
        "anthropic-auth-token",
        "credential",
        "credentials",
    }
)


def is_credential(name: str) -> bool:
    """True for header names and keys that carry or identify a credential (never
    logged or stored)."""
    return name.lower().replace("_", "-") in CREDENTIAL_NAMES


def upstream_request_headers(headers: Iterable[tuple[bytes, bytes]]) -> list[tuple[str, str]]:
    """Client request headers to send upstream (names as received, values as latin-1)."""
    out: list[tuple[str, str]] = []
    for name, value in headers:
        lower = name.lower()
        if lower in _REQUEST_DROP or lower.startswith(b"x-lore-"):
            continue
        out.append((name.decode("latin-1"), value.decode("latin-1")))
    return out


def client_response_headers(headers: Iterable[tuple[bytes, bytes]]) -> RawHeaders:
    """Upstream response headers to relay to the client."""
    return [(n, v) for n, v in headers if n.lower() not in _RESPONSE_DROP]


def header_map(headers: Iterable[tuple[bytes, bytes]]) -> dict[str, str]:
    """Lower-case name → value (the last one wins), for lookups."""
    return {n.decode("latin-1").lower(): v.decode("latin-1") for n, v in headers}
