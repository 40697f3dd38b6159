"""``codex.rate_limits`` events: sanitised by allow-list and kept in a bounded log.

The ChatGPT Codex backend sends a ``codex.rate_limits`` event (usually before
``response.created``) telling the client how much of its plan window is used.
We keep the recent ones so a buffered or synthesised answer can still carry
them, but the event comes from upstream and may hold anything, so only the
fields Codex reads survive, each range-checked (lore-spec D.9).
"""

from __future__ import annotations

import json
import re
from decimal import Decimal, InvalidOperation
from typing import Any

RATE_LIMITS_EVENT = "codex.rate_limits"

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_NAME_FIELDS = ("plan_type", "metered_limit_name", "limit_name")
_WINDOWS = ("primary", "secondary")
# Ten years of minutes; longer windows are not a real plan.
_MAX_WINDOW_MINUTES = 5_256_000
# 9999-12-31T23:59:59Z, the largest timestamp every client can format.
_MAX_RESET_AT = 253_402_300_799

# A stream carries one or two of these; a long recall chain a handful. The
# bounds only stop a hostile upstream from growing our state without limit.
MAX_EVENTS = 64
MAX_BYTES = 16 * 1024


def _number(value: object, lo: float, hi: float) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and value == value  # not NaN
        and lo <= value <= hi
    )


def _window(raw: object) -> dict[str, Any] | None:
    if not isinstance(raw, dict):
        return None
    out: dict[str, Any] = {}
    if _number(raw.get("used_percent"), 0, 100):
        out["used_percent"] = raw["used_percent"]
    if _number(raw.get("window_minutes"), 1, _MAX_WINDOW_MINUTES):
        out["window_minutes"] = raw["window_minutes"]
    if _number(raw.get("reset_at"), 0, _MAX_RESET_AT):
        out["reset_at"] = raw["reset_at"]
    return out or None


def _balance(value: object) -> bool:
    if _number(value, 0, float("inf")):
        return True
    if not isinstance(value, str) or len(value) > 32:
        return False
    try:
        parsed = Decimal(value)
    except InvalidOperation:
        return False
    return parsed.is_finite() and parsed >= 0


def _credits(raw: object) -> dict[str, Any] | None:
    if not isinstance(raw, dict):
        return None
    out: dict[str, Any] = {}
    for key in ("has_credits", "unlimited"):
        if isinstance(raw.get(key), bool):
            out[key] = raw[key]
    if _balance(raw.get("balance")):
        out["balance"] = raw["balance"]
    return out or None


def sanitize_rate_limits(payload: object) -> dict[str, Any] | None:
    """The allow-listed copy of a ``codex.rate_limits`` payload, or None when
    nothing valid is left besides its type."""
    if not isinstance(payload, dict) or payload.get("type") != RATE_LIMITS_EVENT:
        return None
    out: dict[str, Any] = {}
    for key in _NAME_FIELDS:
        value = payload.get(key)
        if isinstance(value, str) and _NAME.fullmatch(value):
            out[key] = value
    limits = payload.get("rate_limits")
    if isinstance(limits, dict):
        windows = {name: w for name in _WINDOWS if (w := _window(limits.get(name)))}
        if windows:
            out["rate_limits"] = windows
    credits = _credits(payload.get("credits"))
    if credits:
        out["credits"] = credits
    if not out:
        return None
    return {"type": RATE_LIMITS_EVENT, **out}


class RateLimitLog:
    """Sanitised rate-limit events in arrival order, bounded.

    A consecutive duplicate is dropped (the backend repeats the event on every
    round of a tool loop); once :data:`MAX_EVENTS` events or :data:`MAX_BYTES`
    of JSON are held, later events are dropped rather than earlier ones, so
    what is kept is a true prefix of what arrived.
    """

    def __init__(self) -> None:
        self._events: list[dict[str, Any]] = []
        self._bytes = 0

    @property
    def events(self) -> list[dict[str, Any]]:
        return list(self._events)

    def append(self, payload: object) -> bool:
        """Sanitise and keep ``payload``; return whether it was kept."""
        event = sanitize_rate_limits(payload)
        if event is None or (self._events and self._events[-1] == event):
            return False
        size = len(json.dumps(event, separators=(",", ":")))
        if len(self._events) >= MAX_EVENTS or self._bytes + size > MAX_BYTES:
            return False
        self._events.append(event)
        self._bytes += size
        return True
