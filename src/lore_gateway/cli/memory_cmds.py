"""``lore recall``, ``lore data list|show|delete`` and ``lore import codex|claude-code``.

In personal mode (the default) every command acts on the one memory with no
flags; in team mode a command names its tenant (``cli/scope.py``). Ids may be
shortened to a unique prefix. Nothing here prints a credential.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

import typer
from rich.console import Console

from lore_gateway.cli import output, preflight
from lore_gateway.cli.main import app
from lore_gateway.cli.scope import (
    AllTenantsOpt,
    KeyEnvOpt,
    TenantOpt,
    fail,
    resolve_session,
    resolve_tenant,
)
from lore_gateway.config import Settings
from lore_gateway.memory.data import catalog
from lore_gateway.memory.search.dedupe import fold
from lore_gateway.memory.search.hits import Hit
from lore_gateway.memory.service import SCOPES, Memory
from lore_gateway.memory.store.records import Identity

data_app = typer.Typer(help="Look inside the memory: list, show, delete, forget and embed.",
                       no_args_is_help=True)
import_app = typer.Typer(help="Import existing agent histories into the memory.",
                         no_args_is_help=True)
app.add_typer(data_app, name="data")
app.add_typer(import_app, name="import")

console = Console()

@contextmanager
def open_memory(embedder: Literal["auto"] | None = None, *,
                embed_backlog: bool = True) -> Iterator[Memory]:
    settings = preflight.settings()
    preflight.require_data_dir(settings)
    memory = Memory.open(settings, embedder=embedder, embed_backlog=embed_backlog)
    try:
        yield memory
    finally:
        memory.close()


def _hit_json(hit: Hit) -> dict[str, Any]:
    return {"ref": hit.ref, "score": round(hit.score, 4), "role": hit.role,
            "content": hit.content, "created_at": hit.created_at, "session": hit.session,
            "project": hit.project, "folded": list(hit.folded),
            "superseded_by": hit.superseded_by}


# --- lore recall ---------------------------------------------------------------------


@app.command("recall")
def recall_command(
    query: str = typer.Argument(..., help="What to look for."),
    scope: str = typer.Option("all", "--scope", help="session, project or all."),
    project: str = typer.Option(None, "--project", help="Project for --scope project "
                                "(default: the current directory)."),
    session: str = typer.Option(None, "--session", help="Session for --scope session."),
    limit: int = typer.Option(10, "--limit", min=1, max=50, help="How many results."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    tenant: str = TenantOpt, key_env: str = KeyEnvOpt, all_tenants: bool = AllTenantsOpt,
) -> None:
    """Search the memory the way the model's recall tool does."""
    if scope not in SCOPES:
        raise fail(f"--scope must be one of {', '.join(SCOPES)}, not {scope!r}")
    if scope == "session" and not session:
        raise fail("--scope session needs --session <id> (see `lore data list`)")
    project = project or os.getcwd()
    if not all_tenants:
        from lore_gateway.cli.recall_client import ask_gateway

        answer = ask_gateway(Settings(), query=query, scope=scope, project=project,
                             session=session, limit=limit, tenant=tenant, key_env=key_env)
        if answer is not None:
            rendered = answer.pop("rendered")
            typer.echo(json.dumps(answer, ensure_ascii=False) if as_json else rendered)
            return
    with open_memory("auto", embed_backlog=False) as memory:
        chosen = resolve_tenant(memory, tenant, key_env, all_tenants)
        if session:
            session = resolve_session(memory, chosen, session)
        tenants = [t.tenant for t in memory.tenants()] if chosen is None else [chosen]
        results = [memory.search_sync(query, identity=Identity(t, project, session or ""),
                                      scope=scope, limit=limit) for t in tenants]
        # Tenants' results merged: still one hit per output, copies folded (``dedupe``).
        hits = fold(sorted((h for r in results for h in r.hits),
                           key=lambda h: -h.score))[:limit]
        if as_json:
            typer.echo(json.dumps({
                "query": query, "scope": scope, "tenants": tenants,
                "total": sum(r.total for r in results), "hits": [_hit_json(h) for h in hits],
            }, ensure_ascii=False))
            return
        if not results:
            typer.echo("No results found for this query.")
            return
        merged = results[0] if len(results) == 1 else type(results[0])(
            query=query, scope=scope, hits=hits, total=sum(r.total for r in results),
            project=project)
        output.prose(memory.render(merged))


# --- lore data -----------------------------------------------------------------------


@data_app.command("list")
def data_list(
    project: str = typer.Option(None, "--project", help="Only this project."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    tenant: str = TenantOpt, key_env: str = KeyEnvOpt, all_tenants: bool = AllTenantsOpt,
) -> None:
    """Projects and sessions, with turn and message counts and last activity."""
    with open_memory() as memory:
        chosen = resolve_tenant(memory, tenant, key_env, all_tenants)
        sessions = memory.sessions(chosen, project=project)
        tenants = memory.tenants() if chosen is None else []
    if as_json:
        typer.echo(json.dumps({"tenant": chosen, "sessions": [
            {"tenant": s.tenant, "project": s.project, "session": s.session, "turns": s.turns,
             "messages": s.messages, "first_seen": s.first_seen, "last_seen": s.last_seen}
            for s in sessions]}))
        return
    if not sessions:
        output.line("No stored sessions" + (f" for project {project}." if project else "."))
        return
    if tenants:
        output.print_table(
            [output.Column("tenant", wrap=False), output.Column("sessions", "right", False),
             output.Column("messages", "right", False), output.Column("last activity")],
            [(t.tenant, t.sessions, t.messages, catalog.age(t.last_seen)) for t in tenants],
            title="Tenants")
    # Ids are printed whole: they are what `lore data show|delete` take.
    columns = [output.Column("session", wrap=False), output.Column("turns", "right", False),
               output.Column("messages", "right", False), output.Column("last activity"),
               *((output.Column("tenant", wrap=False),) if chosen is None else ())]

    def cells(s: catalog.SessionSummary) -> list[object]:
        return [s.session, s.turns, s.messages, catalog.age(s.last_seen),
                *((s.tenant,) if chosen is None else ())]

    if not output.is_terminal():
        output.print_table([output.Column("project"), *columns],
                           [[s.project, *cells(s)] for s in sessions])
        return
    by_project: dict[str, list[catalog.SessionSummary]] = {}
    for s in sessions:
        by_project.setdefault(s.project, []).append(s)
    # On a terminal each project is a heading over its sessions: paths are long, and
    # a column of them would leave no room at 80 columns.
    for i, (name, group) in enumerate(by_project.items()):
        if i:
            output.line()
        heading = f"{name}  ({output.plural(len(group), 'session')})"
        output.line(heading if len(heading) <= output.width() else name, style="bold")
        output.print_table(columns, [cells(s) for s in group])


@data_app.command("show")
def data_show(
    session: str = typer.Argument(..., help="Session id or a unique prefix of it "
                                  "(see `lore data list`)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    tenant: str = TenantOpt, key_env: str = KeyEnvOpt, all_tenants: bool = AllTenantsOpt,
) -> None:
    """Every stored message of one session, in order."""
    with open_memory() as memory:
        chosen = resolve_tenant(memory, tenant, key_env, all_tenants)
        session = resolve_session(memory, chosen, session)
        messages = memory.session_messages(chosen, session)
        context = _context_of(memory, chosen, session)
    if not messages:
        raise fail(f"no stored session {session!r}; see `lore data list`")
    if as_json:
        typer.echo(json.dumps({"session": session, "context": context, "messages": [
            {"ref": m.ref, "turn": m.turn_id, "role": m.role, "content": m.content,
             "tokens": m.tokens, "created_at": m.created_at, "truncated": m.truncated,
             "complete": m.complete} for m in messages]}, ensure_ascii=False))
        return
    last_turn = None
    terminal = output.is_terminal()
    for m in messages:
        if m.turn_id != last_turn:
            stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(m.created_at))
            note = "" if m.complete else " [incomplete]"
            if terminal:
                console.rule(f"turn {m.turn_id} · {stamp}{note}", style="dim")
            else:
                output.line(f"--- turn {m.turn_id} · {stamp}{note}")
            last_turn = m.turn_id
        if terminal:
            console.print(f"[bold]{m.role}[/bold] [dim]({m.ref})[/dim]")
            console.print(m.content, markup=False, highlight=False)
        else:
            output.line(f"{m.role} ({m.ref})")
            output.line(m.content)
    if context is not None:
        share = context["cache_read_share"]
        output.line(f"context: layer {context['layer']}, cache-read share "
                    f"{'n/a' if share is None else f'{share:.1%}'}, "
                    f"{output.plural(context['rewrites'], 'rewrite')}")


def _context_of(memory: Memory, tenant: str | None, session: str) -> dict[str, Any] | None:
    """The session's context-management state (docs/context.md), if it has one."""
    from lore_gateway.context import store as cstore

    try:
        state = memory.read(lambda c: cstore.for_session(c, tenant, session))
    except Exception:
        return None
    return cstore.describe(state) if state is not None else None


@data_app.command("delete")
def data_delete(
    target: str = typer.Argument(..., help="A session id or a project (or a unique prefix "
                                 "of either)."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
    tenant: str = TenantOpt, key_env: str = KeyEnvOpt, all_tenants: bool = AllTenantsOpt,
) -> None:
    """Delete a session or a whole project (asks first unless --yes)."""
    with open_memory() as memory:
        chosen = resolve_tenant(memory, tenant, key_env, all_tenants)
        kind, target = _session_or_project(memory, chosen, target)
        selector = {kind: target}
        turns = memory.count_turns(chosen, **selector)
        if turns == 0:
            raise fail(f"no stored session or project {target!r}; see `lore data list`")
        if not yes and not typer.confirm(
                f"Delete {kind} {target} ({output.plural(turns, 'turn')})?"):
            raise typer.Exit(code=1)
        with output.stages() as update:
            deleted = memory.delete(
                chosen, **selector,
                progress=lambda done, total: update(f"deleting {kind}", done, total))
    typer.echo(f"Deleted {kind} {target}: {output.plural(deleted, 'turn')}.")


def _session_or_project(memory: Memory, tenant: str | None, target: str) -> tuple[str, str]:
    """("session" | "project", full id) for a session or project id or unique prefix."""
    stored = memory.sessions(tenant)
    for kind, ids in (("session", [s.session for s in stored]),
                      ("project", [s.project for s in stored])):
        if target in ids:
            return kind, target
    candidates = [("session", s.session) for s in stored if s.session.startswith(target)]
    candidates += [("project", p) for p in dict.fromkeys(s.project for s in stored)
                   if p.startswith(target)]
    if len(candidates) == 1:
        return candidates[0]
    if not candidates:
        raise fail(f"no stored session or project {target!r}; see `lore data list`")
    shown = ", ".join(f"{k} {v}" for k, v in candidates[:5])
    raise fail(f"{target!r} is ambiguous: {len(candidates)} sessions or projects start with it "
               f"({shown}{', ...' if len(candidates) > 5 else ''}); give more characters")



# --- lore import ---------------------------------------------------------------------


def _run_import(source: str, path: Path | None, tenant: str | None, key_env: str | None) -> None:
    from lore_gateway.cli.import_progress import run_with_progress
    from lore_gateway.memory.importers import claude_code, codex

    module = codex if source == "codex" else claude_code
    root = path or module.default_root()
    if not root.exists():
        raise fail(f"{root} does not exist; pass the path of your {source} history")
    files = module.find_files(root)
    if not files:
        raise fail(f"no {source} history files under {root}")
    with open_memory("auto") as memory:
        chosen = resolve_tenant(memory, tenant, key_env, False)
        assert chosen is not None
        stats = run_with_progress(memory, source, files, module.parse, module.is_transcript,
                                  tenant=chosen)
    if stats.foreign and not stats.files:
        what = "is not a" if len(stats.foreign) == 1 else "are not"
        raise fail(f"{', '.join(map(str, stats.foreign[:3]))} {what} {source} history "
                   f"file{'s' if len(stats.foreign) > 1 else ''}; "
                   + ("pass a rollout-*.jsonl file or ~/.codex/sessions" if source == "codex"
                      else "pass a ~/.claude/projects/<project>/<session>.jsonl transcript "
                           "or a directory of them"))
    if stats.foreign:
        n = len(stats.foreign)
        typer.echo(f"lore: skipped {output.plural(n, 'file')} that "
                   f"{'is not a' if n == 1 else 'are not'} {source} history "
                   f"{output.plural(n, 'file')[len(str(n)) + 1:]} (first: {stats.foreign[0]})",
                   err=True)
    typer.echo(f"Imported {output.plural(stats.files, 'file')}: "
               f"{output.plural(stats.turns_new, 'new turn')}, "
               f"{stats.turns_already_stored} already stored ({stats.messages_read} messages "
               f"read, tenant {chosen}).")


CodexPathArg = typer.Argument(None, help="A rollout file or a directory "
                              "(default ~/.codex/sessions).")
ClaudePathArg = typer.Argument(None, help="A transcript or a directory "
                               "(default ~/.claude/projects).")


@import_app.command("codex")
def import_codex(
    path: Path = CodexPathArg,
    tenant: str = TenantOpt, key_env: str = KeyEnvOpt,
) -> None:
    """Import Codex CLI rollouts (rollout-*.jsonl). Safe to run again."""
    _run_import("codex", path, tenant, key_env)


@import_app.command("claude-code")
def import_claude_code(
    path: Path = ClaudePathArg,
    tenant: str = TenantOpt, key_env: str = KeyEnvOpt,
) -> None:
    """Import Claude Code transcripts (projects/*/*.jsonl). Safe to run again."""
    _run_import("claude-code", path, tenant, key_env)
