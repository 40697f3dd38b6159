"""Amnesia: sessions, a tenant or the whole gateway kept out of memory on request.

``lore amnesia on|off [--session ID]`` and the switch in ``/ui`` write one row
each in the ``kv`` table, so the setting survives a restart, is the same for
every instance sharing the database, and reaches a running gateway from another
process. While a row covers a request's session, the gateway treats the request
exactly as one carrying ``x-lore-no-store`` (``privacy.py``): forwarded, recall
still served, nothing of its turn kept.

The proxy asks on its event loop, so it never reads the database per request: an
:class:`AmnesiaSwitch` holds the rows in memory and a background thread re-reads
them every :data:`REFRESH_SECONDS` (the pattern of ``keys.KeyRing``); a change
made in the same process (``/ui``) is applied at once with ``reload``.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Literal

import orjson

from lore_gateway.storage.base import Connection
from lore_gateway.storage.db import ConnFactory
from lore_gateway.storage.errors import StorageError

log = logging.getLogger(__name__)

Scope = Literal["all", "tenant", "session"]
KEY_PREFIX = "amnesia:"
# How stale a running gateway's view may be after `lore amnesia` in another process.
# The CLI says so; the tests wait for it.
REFRESH_SECONDS = 1.0


@dataclass(frozen=True, slots=True)
class Amnesia:
    """One row: what it covers (everything, one tenant's sessions, or one session),
    since when, and who turned it on (``cli`` or ``ui``)."""

    scope: Scope
    tenant: str | None
    session: str | None
    since: float
    by: str

    @property
    def key(self) -> str:
        return key_of(self.scope, self.tenant, self.session)

    def covers(self, tenant: str, session: str) -> bool:
        if self.scope == "all":
            return True
        if self.tenant != tenant:
            return False
        return self.scope == "tenant" or self.session == session

    def describe(self) -> str:
        if self.scope == "all":
            return "every session (gateway-wide)"
        if self.scope == "tenant":
            return f"every session of tenant {self.tenant}"
        return f"session {self.session}"


def key_of(scope: Scope, tenant: str | None, session: str | None) -> str:
    if scope == "all":
        return KEY_PREFIX + "all"
    if scope == "tenant":
        return KEY_PREFIX + "tenant:" + str(tenant)
    # Session ids are chosen by clients and may hold any character: JSON keeps the
    # two parts apart.
    return KEY_PREFIX + "session:" + orjson.dumps([tenant, session]).decode()


def _check(scope: Scope, tenant: str | None, session: str | None) -> None:
    if scope != "all" and not tenant:
        raise ValueError(f"amnesia for a {scope} needs its tenant")
    if scope == "session" and not session:
        raise ValueError("amnesia for a session needs the session id")


def entries(conn: Connection) -> list[Amnesia]:
    """Every amnesia row, oldest first."""
    # ``kv`` holds a few rows per tenant: a scan is fine, and substr compares
    # exactly on both backends (LIKE ignores case on SQLite; a range would follow
    # Postgres's collation, which may skip punctuation).
    rows = conn.execute("SELECT value FROM kv WHERE substr(key, 1, ?) = ?",
                        (len(KEY_PREFIX), KEY_PREFIX)).fetchall()
    found = []
    for (value,) in rows:
        try:
            data = orjson.loads(str(value))
            found.append(Amnesia(data["scope"], data.get("tenant"), data.get("session"),
                                 float(data["since"]), str(data.get("by", ""))))
        except (ValueError, KeyError, TypeError):
            # A row this version cannot read stays where it is; it covers nothing.
            continue
    return sorted(found, key=lambda a: a.since)


def turn_on(conn: Connection, scope: Scope, tenant: str | None = None,
            session: str | None = None, *, by: str = "cli") -> Amnesia:
    """Cover ``scope`` from now on; already on: unchanged (it keeps its start)."""
    _check(scope, tenant, session)
    key = key_of(scope, tenant, session)
    for existing in entries(conn):
        if existing.key == key:
            return existing
    entry = Amnesia(scope, tenant if scope != "all" else None,
                    session if scope == "session" else None, time.time(), by)
    value = orjson.dumps({"scope": entry.scope, "tenant": entry.tenant,
                          "session": entry.session, "since": entry.since, "by": by}).decode()
    with conn:
        conn.execute("INSERT INTO kv(key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE"
                     " SET value = excluded.value", (key, value))
    return entry


def turn_off(conn: Connection, scope: Scope, tenant: str | None = None,
             session: str | None = None) -> bool:
    """Stop covering ``scope``; whether it was on."""
    _check(scope, tenant, session)
    with conn:
        conn.execute("DELETE FROM kv WHERE key = ?", (key_of(scope, tenant, session),))
        return bool(conn.changes())


def covering(found: list[Amnesia], tenant: str, session: str) -> Amnesia | None:
    """The row that keeps this session out of memory, if any."""
    return next((a for a in found if a.covers(tenant, session)), None)


class AmnesiaSwitch:
    """The amnesia rows in memory, refreshed by a background thread."""

    def __init__(self, conn_factory: ConnFactory, *, refresh: float = REFRESH_SECONDS) -> None:
        self._factory = conn_factory
        self._refresh = refresh
        self._entries: list[Amnesia] = []
        self._stop = threading.Event()
        try:
            self.reload()
        except StorageError as exc:
            log.warning("could not read the amnesia settings (%s); retrying every %.0f s",
                        exc, refresh)
        self._thread = threading.Thread(target=self._run, name="lore-amnesia", daemon=True)
        self._thread.start()

    def active(self, tenant: str, session: str) -> Amnesia | None:
        """The row covering this session, or None (never blocks)."""
        found = self._entries  # one read of an atomically swapped list
        return covering(found, tenant, session) if found else None

    @property
    def entries(self) -> list[Amnesia]:
        return list(self._entries)

    def reload(self) -> None:
        conn = self._factory()
        try:
            self._entries = entries(conn)
        finally:
            conn.close()

    def _run(self) -> None:
        while not self._stop.wait(self._refresh):
            try:
                self.reload()
            except StorageError as exc:
                log.warning("could not re-read the amnesia settings (%s); keeping the last"
                            " ones", exc)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
