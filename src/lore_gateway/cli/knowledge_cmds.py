"""``lore distill`` and ``lore knowledge list|show|edit|delete|export|log|diff``."""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console

from lore_gateway.cli import output
from lore_gateway.cli.main import app
from lore_gateway.cli.memory_cmds import open_memory
from lore_gateway.cli.scope import AllTenantsOpt, KeyEnvOpt, TenantOpt, fail, resolve_tenant
from lore_gateway.config import Settings
from lore_gateway.distill import store as dstore
from lore_gateway.knowledge import export as ex
from lore_gateway.knowledge import history, store, sync
from lore_gateway.knowledge.store import CATEGORIES, KnowledgeError
from lore_gateway.storage.base import Connection

if TYPE_CHECKING:
    from lore_gateway.memory.service import Memory

knowledge_app = typer.Typer(help="Long-term knowledge: what the gateway learned per project.",
                            no_args_is_help=True)
app.add_typer(knowledge_app, name="knowledge")
console = Console()

JsonOpt = typer.Option(False, "--json", help="Print JSON.")


@app.command("distill")
def distill_command(
    session: str = typer.Option(None, "--session", help="Only this session (see "
                                "`lore data list`); default: every session with new turns."),
    now: bool = typer.Option(False, "--now", help="Distill now, without a model call (the "
                             "extractive distiller; the gateway's worker uses the model)."),
    as_json: bool = JsonOpt,
    tenant: str = TenantOpt, key_env: str = KeyEnvOpt, all_tenants: bool = AllTenantsOpt,
) -> None:
    """Turn undistilled turns into observation logs."""
    if not now:
        raise fail("the running gateway distills in the background; pass --now to distill "
                   "here and now (no model call)")
    with open_memory() as memory:
        chosen = resolve_tenant(memory, tenant, key_env, all_tenants)
        pairs = memory.read(lambda c: dstore.sessions_with_undistilled(c, chosen))
        if session is not None:
            pairs = [p for p in pairs if p[1] == session or p[1].startswith(session)]
        made: dict[str, int] = {}
        for pair in pairs:
            made[pair[1]] = len(memory.write_job(partial(_distill_pair, pair)))
    if as_json:
        typer.echo(json.dumps({"sessions": made, "distillations": sum(made.values())}))
        return
    typer.echo(f"{sum(made.values())} distillations from {len(made)} sessions")


def _distill_pair(pair: tuple[str, str], conn: Connection) -> list[int]:
    return dstore.distill_extractive(conn, pair[0], pair[1],
                                     consolidate_after=Settings().distill_consolidate_after)


def _entry_rows(memory: Memory, tenant: str | None, project: str | None) -> list[store.Entry]:
    return list(memory.read(lambda c: store.entries(c, tenant, project)))


@knowledge_app.command("list")
def list_command(
    project: str = typer.Option(None, "--project", help="Only this project (with the tenant's "
                                "cross-project entries); default: every project."),
    here: bool = typer.Option(False, "--here", help="Only the current directory's project."),
    as_json: bool = JsonOpt,
    tenant: str = TenantOpt, key_env: str = KeyEnvOpt, all_tenants: bool = AllTenantsOpt,
) -> None:
    """List knowledge entries."""
    if here:
        project = os.getcwd()
    with open_memory() as memory:
        chosen = resolve_tenant(memory, tenant, key_env, all_tenants)
        rows = _entry_rows(memory, chosen, project)
    if as_json:
        typer.echo(json.dumps([e.to_json() for e in rows], ensure_ascii=False))
        return
    output.print_table(
        [output.Column("id", wrap=False), output.Column("category", wrap=False),
         output.Column("title"), output.Column("project"),
         output.Column("conf", "right", False)],
        [(e.id[:8], e.category, e.title, "(all projects)" if e.cross_project else e.project,
          f"{e.confidence:.1f}") for e in rows],
        title=output.plural(len(rows), "knowledge entry", "knowledge entries"))


@knowledge_app.command("show")
def show_command(
    entry_id: str = typer.Argument(..., help="Entry id (or a unique prefix)."),
    as_json: bool = JsonOpt,
    tenant: str = TenantOpt, key_env: str = KeyEnvOpt, all_tenants: bool = AllTenantsOpt,
) -> None:
    """Show one entry."""
    with open_memory() as memory:
        chosen = resolve_tenant(memory, tenant, key_env, all_tenants)
        entry = _get(memory, chosen, entry_id)
    if as_json:
        typer.echo(json.dumps(entry.to_json(), ensure_ascii=False))
        return
    typer.echo(f"{entry.title}  [{entry.category}, confidence {entry.confidence:.1f}]")
    typer.echo(f"id {entry.id} · project {entry.project}"
               + (" · cross-project" if entry.cross_project else "")
               + f" · source {entry.source or '-'}")
    typer.echo("")
    typer.echo(entry.content)


@knowledge_app.command("edit")
def edit_command(
    entry_id: str = typer.Argument(..., help="Entry id (or a unique prefix)."),
    title: str = typer.Option(None, "--title"),
    content: str = typer.Option(None, "--content"),
    category: str = typer.Option(None, "--category", help=", ".join(CATEGORIES)),
    confidence: float = typer.Option(None, "--confidence", min=0.0, max=1.0),
    cross_project: bool = typer.Option(None, "--cross-project/--project-only",
                                       help="Show it in every project of yours, or only here."),
    as_json: bool = JsonOpt,
    tenant: str = TenantOpt, key_env: str = KeyEnvOpt, all_tenants: bool = AllTenantsOpt,
) -> None:
    """Change an entry (and rewrite the project's .lore.md)."""
    with open_memory() as memory:
        chosen = resolve_tenant(memory, tenant, key_env, all_tenants)
        old = _get(memory, chosen, entry_id)

        def run(conn: Connection) -> store.Entry:
            with conn:
                entry, _ = store.upsert(
                    conn, tenant=old.tenant, project=old.project,
                    category=category or old.category, title=title or old.title,
                    content=content or old.content,
                    confidence=old.confidence if confidence is None else confidence,
                    source="lore knowledge edit",
                    cross_project=old.cross_project if cross_project is None else cross_project,
                    entry_id=old.id, actor=history.USER)
            return entry

        try:
            entry = memory.write_job(run)
        except KnowledgeError as exc:
            raise fail(str(exc)) from None
        _export(memory, entry.tenant, entry.project)
    typer.echo(json.dumps(entry.to_json(), ensure_ascii=False) if as_json
               else f"updated {entry.id[:8]} {entry.title}")


@knowledge_app.command("delete")
def delete_command(
    entry_id: str = typer.Argument(..., help="Entry id (or a unique prefix)."),
    tenant: str = TenantOpt, key_env: str = KeyEnvOpt, all_tenants: bool = AllTenantsOpt,
) -> None:
    """Delete an entry (and rewrite the project's .lore.md)."""
    with open_memory() as memory:
        chosen = resolve_tenant(memory, tenant, key_env, all_tenants)
        entry = _get(memory, chosen, entry_id)

        def run(conn: Connection) -> bool:
            with conn:
                return store.delete(conn, entry.tenant, entry.id, actor=history.USER,
                                    source="lore knowledge delete")

        memory.write_job(run)
        _export(memory, entry.tenant, entry.project)
    typer.echo(f"deleted {entry.id[:8]} {entry.title}")


@knowledge_app.command("export")
def export_command(
    project: str = typer.Option(None, "--project", help="Default: the current directory."),
    agents_file: str = typer.Option("AGENTS.md", "--agents-file",
                                    help="Where the pointer section goes (AGENTS.md, CLAUDE.md)."),
    stdout: bool = typer.Option(False, "--stdout", help="Print .lore.md instead of writing it."),
    tenant: str = TenantOpt, key_env: str = KeyEnvOpt, all_tenants: bool = AllTenantsOpt,
) -> None:
    """Write the project's knowledge to .lore.md at its git work-tree root."""
    project = project or os.getcwd()
    with open_memory() as memory:
        chosen = resolve_tenant(memory, tenant, key_env, all_tenants)
        if chosen is None:
            raise fail("export needs one tenant: drop --all-tenants")
        if stdout:
            rows = memory.read(lambda c: store.entries(c, chosen, project, include_cross=False))
            typer.echo(ex.render(rows), nl=False)
            return
        root = ex.work_tree_root(project)
        if root is None:
            raise fail(f"{project} is not inside a git work tree; run it from the repository "
                       "or pass --project, or use --stdout")
        try:
            memory.write_job(lambda c: sync.export(c, chosen, project, root, agents_file))
        except OSError as exc:
            raise fail(f"could not write {root / ex.FILE_NAME}: {exc}") from None
    typer.echo(f"wrote {Path(root) / ex.FILE_NAME}")


@knowledge_app.command("log")
def log_command(
    entry_id: str = typer.Argument(None, help="Only this entry's changes (id or a unique "
                                   "prefix; a deleted entry's too)."),
    project: str = typer.Option(None, "--project", help="Only this project's entries."),
    limit: int = typer.Option(history.DEFAULT_LOG_LIMIT, "--limit", min=1,
                              help="At most this many changes."),
    as_json: bool = JsonOpt,
    tenant: str = TenantOpt, key_env: str = KeyEnvOpt, all_tenants: bool = AllTenantsOpt,
) -> None:
    """Changes to knowledge entries, newest first: who made each (curator, user, import,
    mcp) and what it was (created, updated, superseded, imported, deleted)."""
    with open_memory() as memory:
        chosen = resolve_tenant(memory, tenant, key_env, all_tenants)
        if entry_id is not None:
            full = _history_id(memory, chosen, entry_id)
            rows = memory.read(lambda c: history.versions(c, chosen, full))[::-1][:limit]
        else:
            rows = memory.read(lambda c: history.log(c, chosen, project, limit))
    if as_json:
        typer.echo(json.dumps([v.to_json() for v in rows], ensure_ascii=False))
        return
    output.print_table(
        [output.Column("when", wrap=False), output.Column("id", wrap=False),
         output.Column("v", "right", False), output.Column("change", wrap=False),
         output.Column("by", wrap=False), output.Column("title")],
        [(_when(v.created_at), v.entry_id[:8], str(v.version), v.change, v.actor,
          v.title) for v in rows],
        title=output.plural(len(rows), "change", "changes"))


@knowledge_app.command("diff")
def diff_command(
    entry_id: str = typer.Argument(..., help="Entry id (or a unique prefix)."),
    start: int = typer.Option(None, "--from", help="Compare from the entry as this version "
                              "left it (default: as it was before --to)."),
    end: int = typer.Option(None, "--to", help="Compare to the entry as this version left it "
                            "(default: the newest)."),
    as_json: bool = JsonOpt,
    tenant: str = TenantOpt, key_env: str = KeyEnvOpt, all_tenants: bool = AllTenantsOpt,
) -> None:
    """A unified diff of an entry between two versions (default: its last change)."""
    with open_memory() as memory:
        chosen = resolve_tenant(memory, tenant, key_env, all_tenants)
        full = _history_id(memory, chosen, entry_id)
        chosen_versions = memory.read(lambda c: history.versions(c, chosen, full))
    try:
        old, new, last = history.pick(chosen_versions, start, end)
    except history.HistoryError as exc:
        raise fail(str(exc)) from None
    old_label = (f"{full[:8]} v{start}" if start is not None
                 else f"{full[:8]} before v{last.version}")
    new_label = f"{full[:8]} v{last.version} ({last.change} by {last.actor})"
    text = history.diff(old, new, old_label, new_label)
    if as_json:
        typer.echo(json.dumps({
            "id": full, "from": start, "to": last.version, "change": last.change,
            "actor": last.actor, "before": None if old is None else asdict(old),
            "after": None if new is None else asdict(new), "diff": text}, ensure_ascii=False))
        return
    typer.echo(text.rstrip("\n") if text else "no difference")


def _when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def _history_id(memory: Memory, tenant: str | None, ref: str) -> str:
    try:
        return str(memory.read(lambda c: history.resolve(c, tenant, ref)))
    except history.HistoryError as exc:
        raise fail(str(exc)) from None


def _get(memory: Memory, tenant: str | None, entry_id: str) -> store.Entry:
    try:
        entry: store.Entry = memory.read(lambda c: store.get(c, tenant, entry_id))
    except KnowledgeError as exc:
        raise fail(str(exc)) from None
    return entry


def _export(memory: Memory, tenant: str, project: str) -> None:
    root = ex.work_tree_root(project)
    if root is None or not Settings().export:
        return
    try:
        memory.write_job(lambda c: sync.export(c, tenant, project, root, None))
    except OSError as exc:
        console.print(f"[yellow]warning:[/yellow] could not rewrite {root / ex.FILE_NAME}: {exc}")
