"""Who may look at the memory browser, and whose memory they see.

* **Personal mode on a loopback bind** (the default): the machine's owner. Pages
  answer loopback clients only, whose ``Host`` names this machine (a web page
  elsewhere cannot reach them through DNS rebinding); everyone else is refused.
* **Team mode** (``LORE_TENANCY=keys``) **or a non-loopback bind**: sign-in by
  gateway key. In team mode the key's tenant is the only memory shown; in
  personal mode any live key opens the one personal memory.

A signed-in browser holds a cookie with the tenant's name, an expiry and an HMAC
under a secret made at start (a restart signs everyone out). The key itself is
never kept, shown or logged. Every form carries a token derived from the same
secret and the viewer, so another site cannot post to the gateway on a
visitor's behalf.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import secrets
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lore_gateway.config import Settings
from lore_gateway.memory.tenancy.identity import PERSONAL
from lore_gateway.obs.status import is_loopback

if TYPE_CHECKING:
    from lore_gateway.memory.service import Memory

COOKIE = "lore_ui"
# How long a sign-in lasts: a working day.
SESSION_SECONDS = 12 * 3600
_LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})


@dataclass(frozen=True, slots=True)
class Viewer:
    """The person looking: the one tenant they see, and whether they signed in."""

    tenant: str
    signed_in: bool

    @property
    def label(self) -> str:
        return self.tenant if self.signed_in else "this machine"


def bind_is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class Access:
    """The access policy of one gateway (see the module docstring)."""

    def __init__(self, settings: Settings, memory: Memory | None) -> None:
        self.team = settings.tenancy == "keys"
        self.needs_sign_in = self.team or not bind_is_loopback(settings.host)
        self._memory = memory
        self._secret = secrets.token_bytes(32)

    # --- who is asking --------------------------------------------------------------

    def viewer(self, scope: dict[str, Any]) -> Viewer | None:
        """The viewer of a request, or ``None`` when it must sign in (or go away)."""
        if self.needs_sign_in:
            tenant = self._cookie_tenant(scope)
            return Viewer(tenant, True) if tenant is not None else None
        if is_loopback(scope) and _host_is_local(scope):
            return Viewer(PERSONAL, False)
        return None

    def sign_in(self, key: str) -> str | None:
        """The tenant a gateway key opens, or ``None`` (unknown, revoked, or empty)."""
        key = key.strip()
        if not key or self._memory is None:
            return None
        from lore_gateway.memory.tenancy import keys

        tenant = self._memory.read(lambda conn: keys.tenant_of(conn, key))
        if tenant is None:
            return None
        return str(tenant) if self.team else PERSONAL

    # --- the cookie and the form token ----------------------------------------------

    def cookie_value(self, tenant: str, now: float | None = None) -> str:
        expires = int((time.time() if now is None else now) + SESSION_SECONDS)
        name = base64.urlsafe_b64encode(tenant.encode()).decode().rstrip("=")
        payload = f"{name}.{expires}"
        return f"{payload}.{self._sign(payload)}"

    def _cookie_tenant(self, scope: dict[str, Any]) -> str | None:
        value = _cookies(scope).get(COOKIE)
        if not value or value.count(".") != 2:
            return None
        name, expires, mac = value.split(".")
        if not hmac.compare_digest(mac, self._sign(f"{name}.{expires}")):
            return None
        if not expires.isdigit() or int(expires) < time.time():
            return None
        try:
            return base64.urlsafe_b64decode(name + "=" * (-len(name) % 4)).decode()
        except ValueError:
            return None

    def form_token(self, viewer: Viewer) -> str:
        return self._sign(f"form:{viewer.tenant}:{viewer.signed_in}")

    def form_token_ok(self, viewer: Viewer, token: str) -> bool:
        return hmac.compare_digest(token, self.form_token(viewer))

    def _sign(self, payload: str) -> str:
        return hmac.new(self._secret, payload.encode(), hashlib.sha256).hexdigest()[:32]


def _cookies(scope: dict[str, Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, value in scope.get("headers", []):
        if name.lower() == b"cookie":
            for part in value.decode("latin-1").split(";"):
                key, _, val = part.strip().partition("=")
                if key:
                    out[key] = val
    return out


def _host_is_local(scope: dict[str, Any]) -> bool:
    for name, value in scope.get("headers", []):
        if name.lower() == b"host":
            host = value.decode("latin-1").strip().lower()
            if host.startswith("["):
                host = host[: host.find("]") + 1]
            else:
                host = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
            return host in _LOCAL_HOSTS
    return False
