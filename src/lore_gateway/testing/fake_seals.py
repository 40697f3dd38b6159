"""The fake provider's signatures: opaque values only the fake can make and check.

The real providers hand out values a client must send back untouched: a
thinking block's ``signature`` and a ``redacted_thinking`` block's ``data``
(Anthropic), a reasoning item's ``encrypted_content`` (OpenAI). They refuse any
value they did not make, so a gateway that edits, truncates or invents one
breaks the session. The fake's strict mode (``strict.py``) refuses the same
way; these functions make the values it accepts, so the fake's own answers
and a test's hand-built history pass.

Each value is an HMAC-SHA256 under a fixed test key, with a per-kind label so
a thinking signature cannot stand in for a reasoning seal. The key is public on
purpose: this proves a value came from the fake (or a test that asked for it),
not that it is secret. Pure: no IO.
"""

from __future__ import annotations

import base64
import hashlib
import hmac

import orjson

# A fixed, public key: tests must get the same signature in every run.
_KEY = b"lore-gateway fake upstream: a test key, not a secret"
# Version prefixes: a value without one was not made here and is refused.
THINKING_PREFIX = "fakesig1."
REDACTED_PREFIX = "fakered1."
REASONING_PREFIX = "fakeenc1."


def _mac(label: str, payload: bytes) -> str:
    digest = hmac.new(_KEY, label.encode() + b"\0" + payload, hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _unb64(text: str) -> bytes | None:
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (ValueError, TypeError):
        return None


def _seal(prefix: str, label: str, payload: bytes) -> str:
    body = _b64(payload)
    return f"{prefix}{body}.{_mac(label, body.encode())}"


def _open(prefix: str, label: str, value: object) -> bytes | None:
    """The payload of a sealed value, or None when the fake did not seal it."""
    if not isinstance(value, str) or not value.startswith(prefix):
        return None
    body, dot, mac = value.removeprefix(prefix).partition(".")
    if not dot or not hmac.compare_digest(mac, _mac(label, body.encode())):
        return None
    return _unb64(body)


def sign_thinking(thinking: str) -> str:
    """The ``signature`` the fake gives a thinking block with this text."""
    return THINKING_PREFIX + _mac("thinking", thinking.encode())


def thinking_verifies(thinking: object, signature: object) -> bool:
    """Whether ``signature`` is the fake's signature of exactly this text."""
    return (isinstance(thinking, str) and isinstance(signature, str)
            and hmac.compare_digest(signature, sign_thinking(thinking)))


def seal_redacted(data: str) -> str:
    """A ``redacted_thinking`` block's ``data`` carrying ``data`` (opaque to clients)."""
    return _seal(REDACTED_PREFIX, "redacted", data.encode())


def redacted_verifies(data: object) -> bool:
    """Whether a ``redacted_thinking`` ``data`` value was sealed by the fake."""
    return _open(REDACTED_PREFIX, "redacted", data) is not None


def seal_reasoning(item_id: str, summary: str) -> str:
    """A reasoning item's ``encrypted_content``: the item's id and summary, sealed."""
    payload = orjson.dumps({"id": item_id, "summary": summary})
    return _seal(REASONING_PREFIX, "reasoning", payload)


def reasoning_verifies(encrypted_content: object) -> bool:
    """Whether an ``encrypted_content`` value was sealed by the fake.

    Not bound to the item's id: the real API verifies the content itself, and
    clients such as Copilot rotate reasoning item ids between turns.
    """
    return _open(REASONING_PREFIX, "reasoning", encrypted_content) is not None
