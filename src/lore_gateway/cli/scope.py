"""Which tenant and which session a memory command acts on.

Personal mode (the default): every command acts on the one memory, no flags
needed. Team mode (``LORE_TENANCY=keys``): a command names its tenant with
``--tenant NAME`` or ``--key-env VAR`` (an environment variable holding a gateway
key), or uses the key in ``LORE_KEY`` when that is set. The CLI reads the local
database as its owner, so either flag works in either mode, and ``--all-tenants``
shows everything. Ids may be shortened to any unique prefix.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import typer
from rich.console import Console

from lore_gateway.agents.codex import GATEWAY_KEY_ENV
from lore_gateway.cli import output
from lore_gateway.memory.service import Memory
from lore_gateway.memory.tenancy import keys
from lore_gateway.memory.tenancy.identity import PERSONAL
from lore_gateway.storage import db

# Where `lore run`, `lore setup` and the memory commands look for the user's own
# gateway key in team mode.
DEFAULT_KEY_ENV = GATEWAY_KEY_ENV

err = Console(stderr=True)

TenantOpt = typer.Option(None, "--tenant", help="Tenant name or a unique prefix (team mode, "
                         "LORE_TENANCY=keys; personal mode has one memory and needs no flag). "
                         "`lore data list --all-tenants` lists them.")
KeyEnvOpt = typer.Option(None, "--key-env", metavar="VAR", help="Use the tenant of the gateway "
                         "key held in environment variable VAR (team mode; the key is not "
                         "printed or stored). Default in team mode: LORE_KEY, when set.")
AllTenantsOpt = typer.Option(False, "--all-tenants", help="Include every tenant's memory.")


def fail(message: str) -> output.UserError:
    """A one-line user error (exit 2), raised by the caller."""
    return output.UserError(message)


def unique_prefix(prefix: str, candidates: Iterable[str], what: str, hint: str) -> str:
    """The one candidate equal to ``prefix``, else the one starting with it."""
    pool = list(dict.fromkeys(candidates))
    if prefix in pool:
        return prefix
    matches = [c for c in pool if c.startswith(prefix)] if prefix else []
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise fail(f"no {what} {prefix!r}; {hint}")
    shown = ", ".join(matches[:5]) + (", ..." if len(matches) > 5 else "")
    raise fail(f"{what} {prefix!r} is ambiguous: {len(matches)} match ({shown}); "
               "give more characters")


def tenant_of_key_env(memory: Memory, var: str) -> str:
    key = os.environ.get(var, "").strip()
    if not key:
        raise fail(f"environment variable {var} is not set or empty")
    conn = db.connect(memory.database)
    try:
        tenant = keys.tenant_of(conn, key)
    finally:
        conn.close()
    if tenant is None:
        raise fail(f"the key in {var} is not a valid gateway key here (unknown or revoked); "
                   "`lore keys list` shows the live keys")
    return tenant


def resolve_tenant(memory: Memory, tenant: str | None, key_env: str | None,
                   all_tenants: bool) -> str | None:
    """The one tenant a command acts on, or ``None`` for ``--all-tenants``."""
    if sum((tenant is not None, key_env is not None, all_tenants)) > 1:
        raise fail("give only one of --tenant, --key-env and --all-tenants")
    if all_tenants:
        return None
    if key_env is not None:
        return tenant_of_key_env(memory, key_env)
    if tenant is not None:
        known = [t.tenant for t in memory.tenants()] + _key_tenants(memory)
        return unique_prefix(tenant, [PERSONAL, *known], "tenant",
                             "see `lore data list --all-tenants` and `lore keys list`")
    if memory.settings.tenancy == "personal":
        return PERSONAL
    if os.environ.get(DEFAULT_KEY_ENV, "").strip():
        return tenant_of_key_env(memory, DEFAULT_KEY_ENV)
    raise fail("team mode (LORE_TENANCY=keys): say whose memory with --tenant NAME or "
               f"--key-env VAR, or set {DEFAULT_KEY_ENV} to your gateway key; "
               "`lore keys list` shows the tenants")


def resolve_session(memory: Memory, tenant: str | None, prefix: str) -> str:
    """A stored session id of ``tenant`` from its id or a unique prefix of it."""
    ids = [s.session for s in memory.sessions(tenant)]
    return unique_prefix(prefix, ids, "stored session", "see `lore data list`")


def _key_tenants(memory: Memory) -> list[str]:
    conn = db.connect(memory.database)
    try:
        return [k.tenant for k in keys.list_keys(conn)]
    finally:
        conn.close()
