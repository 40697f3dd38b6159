"""Gateway keys: who a request belongs to in team mode (``LORE_TENANCY=keys``).

A key is a random secret (``lore_k_…``) that the owner hands to one person; their
agents send it in the ``X-Lore-Key`` header and it selects their tenant. Only the
SHA-256 of a key is stored: keys carry 190 bits of randomness, so a plain digest
cannot be reversed or guessed, and a leaked database reveals no usable key. The
header is stripped before the request goes upstream (every ``x-lore-*`` header
is) and counts as a credential, so it is never logged or stored.

The proxy looks keys up on its event loop, so it never reads the database per
request: a :class:`KeyRing` holds the digests in memory and a background thread
re-reads the (tiny) table every :data:`REFRESH_SECONDS`, so ``lore keys create``
and ``revoke`` take effect on a running gateway within that delay.
"""

from __future__ import annotations

import hashlib
import logging
import re
import secrets
import threading
import time
from dataclasses import dataclass

from lore_gateway.storage.base import Connection
from lore_gateway.storage.db import ConnFactory
from lore_gateway.storage.errors import StorageError

log = logging.getLogger(__name__)

KEY_HEADER = "x-lore-key"
KEY_PREFIX = "lore_k_"
# 32 url-safe characters: 190 bits of randomness.
KEY_RANDOM_BYTES = 24
# The short public id shown by `lore keys list` and taken by `revoke`.
KEY_ID_CHARS = 8
# How stale a running gateway's view of the keys table may be.
REFRESH_SECONDS = 1.0
# Tenant names appear in CLI output and are typed by people: keep them plain.
_TENANT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$")


@dataclass(frozen=True, slots=True)
class GatewayKey:
    id: str
    tenant: str
    created_at: float
    revoked_at: float | None


class GatewayKeyError(Exception):
    """A key operation that cannot be done; the message says why and what to do."""


def digest(key: str) -> str:
    return hashlib.sha256(key.strip().encode("utf-8")).hexdigest()


def valid_tenant_name(name: str) -> bool:
    return bool(_TENANT_RE.match(name))


def create(conn: Connection, tenant: str) -> tuple[GatewayKey, str]:
    """A new key for ``tenant``: its record and the secret, which is shown once."""
    if not valid_tenant_name(tenant):
        raise GatewayKeyError(
            f"tenant name {tenant!r} is not allowed: use 1-64 letters, digits, '.', '_', "
            "'@' or '-', starting with a letter or digit")
    secret = KEY_PREFIX + secrets.token_urlsafe(KEY_RANDOM_BYTES)
    now = time.time()
    with conn:
        while True:
            key_id = secrets.token_hex(KEY_ID_CHARS // 2)
            if conn.execute("SELECT 1 FROM gateway_keys WHERE id = ?", (key_id,)).fetchone() \
                    is None:
                break
        conn.execute("INSERT INTO gateway_keys(id, tenant, hash, created_at) VALUES (?,?,?,?)",
                     (key_id, tenant, digest(secret), now))
    return GatewayKey(key_id, tenant, now, None), secret


def list_keys(conn: Connection) -> list[GatewayKey]:
    rows = conn.execute(
        "SELECT id, tenant, created_at, revoked_at FROM gateway_keys ORDER BY created_at")
    return [GatewayKey(str(i), str(t), float(c), None if r is None else float(r))
            for i, t, c, r in rows]


def revoke(conn: Connection, key_id: str) -> GatewayKey:
    """Revoke the key whose id starts with ``key_id`` (which must be unique)."""
    matches = [k for k in list_keys(conn) if k.id.startswith(key_id.strip().lower())]
    if not key_id.strip() or not matches:
        raise GatewayKeyError(f"no gateway key {key_id!r}; `lore keys list` shows the ids")
    if len(matches) > 1:
        raise GatewayKeyError(f"key id {key_id!r} is ambiguous ({len(matches)} keys start "
                              "with it); give more characters")
    key = matches[0]
    if key.revoked_at is not None:
        return key
    now = time.time()
    with conn:
        conn.execute("UPDATE gateway_keys SET revoked_at = ? WHERE id = ?", (now, key.id))
    return GatewayKey(key.id, key.tenant, key.created_at, now)


def tenant_of(conn: Connection, key: str) -> str | None:
    """The tenant a (non-revoked) key selects, read straight from the database."""
    row = conn.execute("SELECT tenant FROM gateway_keys WHERE hash = ? AND revoked_at IS NULL",
                       (digest(key),)).fetchone()
    return None if row is None else str(row[0])


class KeyRing:
    """The live keys' digests in memory, refreshed by a background thread."""

    def __init__(self, conn_factory: ConnFactory, *, refresh: float = REFRESH_SECONDS) -> None:
        self._factory = conn_factory
        self._refresh = refresh
        self._tenants: dict[str, str] = {}
        self._stop = threading.Event()
        self._load()
        self._thread = threading.Thread(target=self._run, name="lore-keyring", daemon=True)
        self._thread.start()

    def tenant(self, key: str) -> str | None:
        """The tenant of ``key``, or ``None`` when it is unknown or revoked (never blocks)."""
        return self._tenants.get(digest(key))

    def _load(self) -> None:
        conn = self._factory()
        try:
            rows = conn.execute(
                "SELECT hash, tenant FROM gateway_keys WHERE revoked_at IS NULL").fetchall()
        finally:
            conn.close()
        self._tenants = {str(h): str(t) for h, t in rows}  # one atomic swap

    def _run(self) -> None:
        while not self._stop.wait(self._refresh):
            try:
                self._load()
            except StorageError as exc:
                log.warning("could not re-read the gateway keys (%s); keeping the last ones", exc)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
