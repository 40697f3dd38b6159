"""``lore keys create|list|revoke``: gateway keys for team mode (``LORE_TENANCY=keys``).

A key is printed once, at creation; the database keeps only its SHA-256.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import typer
from rich.console import Console
from rich.table import Table

from lore_gateway.cli.main import app
from lore_gateway.cli.scope import DEFAULT_KEY_ENV, fail
from lore_gateway.config import Settings
from lore_gateway.memory.tenancy import keys
from lore_gateway.storage import db, schema
from lore_gateway.storage.base import Connection

keys_app = typer.Typer(help="Gateway keys for team mode (LORE_TENANCY=keys): one per person; "
                       "a key selects whose memory a request is.", no_args_is_help=True)
app.add_typer(keys_app, name="keys")


@contextmanager
def _database() -> Iterator[tuple[Settings, Connection]]:
    settings = Settings()
    conn = db.connect(settings.database)
    try:
        schema.migrate(conn)
        yield settings, conn
    finally:
        conn.close()


@keys_app.command("create")
def keys_create(
    tenant: str = typer.Argument(..., help="Whose memory the key opens (a person's name, "
                                 "e.g. alice). Several keys may share a tenant."),
) -> None:
    """Create a key for TENANT and print it once (only its hash is stored)."""
    with _database() as (settings, conn):
        try:
            key, secret = keys.create(conn, tenant)
        except keys.GatewayKeyError as exc:
            raise fail(str(exc)) from None
    typer.echo(secret)
    note = "" if settings.tenancy == "keys" else (
        "\nnote: this gateway runs in personal mode; keys take effect with LORE_TENANCY=keys.")
    typer.echo(f"key {key.id} for tenant {key.tenant}: give it to its owner, who sets "
               f"{DEFAULT_KEY_ENV}=<key> for `lore run` / `lore setup`. It is not shown "
               f"again; `lore keys revoke {key.id}` disables it.{note}", err=True)


@keys_app.command("list")
def keys_list() -> None:
    """Every key: id, tenant, when it was created, and whether it was revoked."""
    with _database() as (_, conn):
        found = keys.list_keys(conn)
    if not found:
        typer.echo("No gateway keys. Create one with `lore keys create <name>`.")
        return
    table = Table("id", "tenant", "created", "status")
    for k in found:
        status = "live" if k.revoked_at is None else f"revoked {_stamp(k.revoked_at)}"
        table.add_row(k.id, k.tenant, _stamp(k.created_at), status)
    Console().print(table)


@keys_app.command("revoke")
def keys_revoke(
    key_id: str = typer.Argument(..., help="The key's id from `lore keys list` (or a unique "
                                 "prefix)."),
) -> None:
    """Revoke a key: a running gateway refuses it within about a second."""
    with _database() as (_, conn):
        try:
            key = keys.revoke(conn, key_id)
        except keys.GatewayKeyError as exc:
            raise fail(str(exc)) from None
    typer.echo(f"Revoked key {key.id} (tenant {key.tenant}); its memory is kept.")


def _stamp(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(ts))
