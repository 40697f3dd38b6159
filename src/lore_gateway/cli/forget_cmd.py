"""``lore data forget --session ID | --since TIME | --match TEXT``: delete turns and
everything made from them, from every table and search index (``memory/data/forget.py``),
after asking (``--yes`` does not ask), as ``lore data delete`` does."""

from __future__ import annotations

import time

import typer

from lore_gateway.cli import output
from lore_gateway.cli.memory_cmds import data_app, open_memory
from lore_gateway.cli.scope import AllTenantsOpt, KeyEnvOpt, TenantOpt, fail, resolve_tenant
from lore_gateway.memory.data.forget import Selector, forget, parse_since, preview


def _when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


@data_app.command("forget")
def data_forget(
    session: str = typer.Option(None, "--session", help="Every turn of this session."),
    since: str = typer.Option(None, "--since", metavar="TIME", help="Turns stored since TIME: "
                              "30m, 2h, 3d, 1w, today, yesterday, 2025-01-31 or "
                              "2025-01-31T14:00 (local time)."),
    match: str = typer.Option(None, "--match", metavar="TEXT", help="Turns with a message "
                              "containing TEXT (any case), and every distillation and "
                              "knowledge entry containing it."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
    tenant: str = TenantOpt, key_env: str = KeyEnvOpt, all_tenants: bool = AllTenantsOpt,
) -> None:
    """Delete turns by session, time or text, from every table and search index.

    With several options, the turns all of them name. What was made from the
    turns goes too: their messages, search entries and vectors, the distillations
    built from them, the recalls kept for replay, the sessions' context state;
    with --match also every knowledge entry holding the text, with --since the
    knowledge the gateway learned by itself since then. Asks first unless --yes."""
    if match is not None and not match.strip():
        raise fail("--match needs a text to look for")
    try:
        selector = Selector(session=session, since=None if since is None else parse_since(since),
                            match=match)
    except ValueError as exc:
        raise fail(f"{exc} (see `lore data forget --help`)") from None
    with open_memory() as memory:
        chosen = resolve_tenant(memory, tenant, key_env, all_tenants)
        turns, sessions = memory.read(lambda c: preview(c, chosen, selector))
        what = _describe(selector)
        if turns == 0 and not selector.match:
            typer.echo(f"No stored turns {what}; nothing was deleted.")
            return
        question = (f"Forget the turns {what} ({output.plural(turns, 'turn')} in "
                    f"{output.plural(sessions, 'session')}) and what was made from them?")
        if not yes and not typer.confirm(question):
            raise typer.Exit(code=1)
        export = memory.settings.export
        with output.stages() as update:
            done = memory.write_job(lambda c: forget(c, chosen, selector, export=export,
                                                     progress=update))
    typer.echo(f"Forgot the turns {what}: {done.summary()}.")
    from lore_gateway.cli.run import probe_health

    if done.turns and probe_health(memory.settings.base_url) is not None:
        # Its context manager holds each session's planned context in memory and
        # saves it now and then: a restart drops what it planned from the turns.
        typer.echo("The gateway at " + memory.settings.base_url + " still holds the context "
                   "it planned for sessions in progress; restart it so that it does not "
                   "save that again.")


def _describe(selector: Selector) -> str:
    parts: list[str] = []
    if selector.session is not None:
        parts.append(f"of session {selector.session}")
    if selector.since is not None:
        parts.append(f"since {_when(selector.since)}")
    if selector.match:
        parts.append(f"containing {selector.match!r}")
    return " ".join(parts)
