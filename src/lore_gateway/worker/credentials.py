"""The session's upstream and credential, held in memory for background jobs.

Captured from the session's own request after its response ended, kept at most
``TTL_S`` after the session's last request and for at most ``MAX_SESSIONS``
sessions (least recently used dropped first). Never written to disk, never
logged: ``repr`` shows no header values and no URL, since a Gemini session's URL
may carry its API key (``?key=``), which is held here like a header.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from lore_gateway.worker.requests import Family

# Headers a worker request needs from the session: the credential, the API
# version and betas (OAuth tokens need their beta), the account of a ChatGPT login,
# Gemini's API key header and the Google Cloud project an OAuth token bills.
KEPT_HEADERS = frozenset({
    "authorization", "x-api-key", "api-key", "anthropic-version", "anthropic-beta",
    "chatgpt-account-id", "openai-organization", "openai-project", "originator", "user-agent",
    "x-goog-api-key", "x-goog-user-project",
})
# Thirty minutes after the session's last request: long enough for the idle
# distillation and the curator that follows, short enough that a credential
# does not outlive the session that lent it by much.
TTL_S = 30 * 60
# Live sessions on one workstation; beyond this the least recent is forgotten
# (its jobs then fall back to the extractive distiller).
MAX_SESSIONS = 256


@dataclass(frozen=True, slots=True)
class SessionUpstream:
    """Where and how the session talks to its provider."""

    family: Family
    url: str = field(repr=False)  # the session's upstream URL, its query included
    model: str | None
    project: str
    headers: tuple[tuple[str, str], ...] = field(repr=False)


class CredentialVault:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._items: OrderedDict[tuple[str, str], tuple[float, SessionUpstream]] = OrderedDict()

    def __repr__(self) -> str:
        return f"CredentialVault({len(self._items)} sessions)"

    def __len__(self) -> int:
        return len(self._items)

    def put(self, tenant: str, session: str, upstream: SessionUpstream) -> None:
        key = (tenant, session)
        self._items.pop(key, None)
        self._items[key] = (self._clock(), upstream)
        while len(self._items) > MAX_SESSIONS:
            self._items.popitem(last=False)

    def get(self, tenant: str, session: str, project: str | None = None) -> SessionUpstream | None:
        """The session's upstream, else the newest one of the same project."""
        self._expire()
        found = self._items.get((tenant, session))
        if found is not None:
            return found[1]
        if project is None:
            return None
        for (t, _s), (_at, upstream) in reversed(self._items.items()):
            if t == tenant and upstream.project == project:
                return upstream
        return None

    def _expire(self) -> None:
        cutoff = self._clock() - TTL_S
        while self._items:
            key, (at, _) = next(iter(self._items.items()))
            if at >= cutoff:
                break
            del self._items[key]


def kept_headers(headers: list[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    return tuple((n, v) for n, v in headers if n.lower() in KEPT_HEADERS)
