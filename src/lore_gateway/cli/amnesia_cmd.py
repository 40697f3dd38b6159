"""``lore amnesia on|off|status [--session ID]``.

Amnesia is a row in the database (``memory/data/amnesia.py``): a running gateway
follows it within a second, every instance on the same database follows it, and
it survives restarts. docs/memory.md, "Keeping things out of memory", explains it
with ``x-lore-no-store``, ``<private>`` and ``lore data forget``.
"""

from __future__ import annotations

import time

import typer

from lore_gateway.cli import output
from lore_gateway.cli.main import app
from lore_gateway.cli.memory_cmds import open_memory
from lore_gateway.cli.scope import KeyEnvOpt, TenantOpt, fail, resolve_tenant
from lore_gateway.memory.data import amnesia

ACTIONS = ("on", "off", "status")


def _when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


@app.command("amnesia")
def amnesia_command(
    action: str = typer.Argument("status", help="on, off or status.", metavar="ACTION"),
    session: str = typer.Option(None, "--session", help="Only this session: its id as the "
                                "agent sends it (`lore data list` shows stored ones). Without "
                                "it: every session, gateway-wide."),
    as_json: bool = typer.Option(False, "--json", help="With status: print one JSON object."),
    tenant: str = TenantOpt, key_env: str = KeyEnvOpt,
) -> None:
    """Keep sessions out of memory: while on, their turns are forwarded and recall
    still answers, but nothing of them is stored (as with the x-lore-no-store header).

    The setting is kept in the database: a running gateway applies it within a
    second, and it stays until `lore amnesia off`."""
    if action not in ACTIONS:
        raise fail(f"give on, off or status, not {action!r} (see `lore amnesia --help`)")
    with open_memory() as memory:
        if action == "status":
            rows = memory.read(amnesia.entries)
            _print_status(rows, as_json)
            return
        scope: amnesia.Scope = "all"
        chosen = None
        if session is not None or tenant is not None or key_env is not None:
            chosen = resolve_tenant(memory, tenant, key_env, False)
            scope = "session" if session is not None else "tenant"
        if action == "on":
            row = memory.write_job(lambda c: amnesia.turn_on(c, scope, chosen, session))
            typer.echo(f"Amnesia on for {row.describe()}, since {_when(row.since)}: nothing "
                       "of its turns is stored until `lore amnesia off"
                       + (f" --session {session}`" if session else "`")
                       + ". A running gateway applies it within a second.")
            return
        was_on = memory.write_job(lambda c: amnesia.turn_off(c, scope, chosen, session))
        what = amnesia.Amnesia(scope, chosen, session, 0.0, "").describe()
        left = memory.read(amnesia.entries)
        still = amnesia.covering(left, chosen, session) if session and chosen else None
    if not was_on:
        typer.echo(f"Amnesia was not on for {what}; nothing changed.")
    else:
        typer.echo(f"Amnesia off for {what}: its turns are stored again.")
    if still is not None:
        typer.echo(f"Note: amnesia is still on for {still.describe()}, which covers this "
                   "session; `lore amnesia off` ends it.")


def _print_status(rows: list[amnesia.Amnesia], as_json: bool) -> None:
    if as_json:
        output.print_json({"on": bool(rows), "entries": [
            {"covers": a.describe(), "scope": a.scope, "tenant": a.tenant,
             "session": a.session, "since": a.since, "by": a.by} for a in rows]})
        return
    if not rows:
        output.line("Amnesia is off: every turn is stored.")
        return
    output.print_table(
        [output.Column("kept out of memory"), output.Column("since", wrap=False),
         output.Column("by", wrap=False)],
        [(a.describe(), _when(a.since), a.by) for a in rows], title="Amnesia")
