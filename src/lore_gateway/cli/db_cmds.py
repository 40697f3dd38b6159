"""``lore db migrate|status|copy``: the memory database itself (docs/storage.md, "Operations").

Each command works on the database the settings name (``LORE_DATABASE_URL``, else
``lore.db`` in the data dir) or on ``--url``. A database that cannot be reached is
one line saying so and how to fix it, never a traceback.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import typer

from lore_gateway.cli import output, preflight
from lore_gateway.cli.main import app
from lore_gateway.cli.scope import fail
from lore_gateway.storage.base import Connection, Database
from lore_gateway.storage.errors import StorageError

db_app = typer.Typer(help="The memory database: migrate it, see its state, copy a memory "
                     "into another database (SQLite → Postgres for a team).",
                     no_args_is_help=True)
app.add_typer(db_app, name="db")

URL_HELP = ("The database: postgresql://user:password@host/dbname or sqlite:///path/to/lore.db "
            "(default: LORE_DATABASE_URL, else lore.db in the data dir).")
# Tables `lore db status` counts: what a person would call their memory.
STATUS_TABLES = ("turns", "messages", "embeddings", "sessions", "recall_anchors",
                 "distillations", "knowledge", "gateway_keys")


def database(url: str | None) -> Database:
    """``--url``, or the database of the settings."""
    if url is None:
        return preflight.settings().database
    from lore_gateway.storage.target import parse_url

    try:
        return parse_url(url)
    except ValueError as exc:
        raise fail(str(exc)) from None


@contextmanager
def connected(db: Database, *, what: str = "the database") -> Iterator[Connection]:
    """A connection to ``db``; a failure to reach it is one line with the fix."""
    # The command reports a failure itself, as one line; no log line besides it.
    logging.getLogger("lore_gateway.storage.postgres").disabled = True
    try:
        conn = db.connect()
    except StorageError as exc:
        reason = _brief(exc)
        named = reason if db.url in reason else f"{db.url}: {reason}"
        whose = "" if what == "the database" else f"{what}: "
        raise fail(f"{whose}{named}; check that the server runs and the URL "
                   "(LORE_DATABASE_URL or --url) is right") from None
    try:
        yield conn
    except StorageError as exc:
        raise fail(f"{what} {db.url}: {_brief(exc)}") from None
    finally:
        with contextlib.suppress(StorageError):
            conn.close()


def _brief(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300]


@db_app.command("migrate")
def migrate_command(
    url: str | None = typer.Option(None, "--url", help=URL_HELP),
) -> None:
    """Bring the database's schema up to this lore-gateway's version (a gateway also
    does this at start; run it ahead of a rolling upgrade of several instances)."""
    from lore_gateway.storage import schema

    db = database(url)
    with connected(db) as conn:
        before = schema.current_version(conn)
        done = threading.Event()
        watcher = None
        if db.backend == "postgres" and before < schema.latest_version(conn):
            watcher = threading.Thread(target=_report_index_builds, args=(db, done),
                                       name="lore-migrate-progress", daemon=True)
            watcher.start()
        try:
            after = schema.migrate(
                conn, progress=output.line,
                index_memory_mb=preflight.settings().database_index_memory_mb)
        except RuntimeError as exc:  # a newer schema than this version knows
            raise fail(str(exc)) from None
        finally:
            done.set()
            if watcher is not None:
                watcher.join(5)
    if after == before:
        output.line(f"{db.url}: schema version {after}, up to date")
    else:
        output.line(f"{db.url}: migrated from schema version {before} to {after}")


# How often ``lore db migrate`` reports a running index build (v12's HNSW index on a
# large store takes many minutes; silence that long looks like a hang).
INDEX_PROGRESS_INTERVAL_S = 30.0


def _report_index_builds(db: Database, done: threading.Event) -> None:
    """Print the progress of an index build the migration runs, on a connection of
    its own, every INDEX_PROGRESS_INTERVAL_S until ``done``."""
    from lore_gateway.storage.schema_pg import index_build_progress

    conn: Connection | None = None
    try:
        while not done.wait(INDEX_PROGRESS_INTERVAL_S):
            conn = conn or db.connect()
            line = index_build_progress(conn)
            if line is not None and not done.is_set():
                output.line(line)
    except StorageError as exc:
        logging.getLogger(__name__).debug("migrate: no index progress (%s)", exc)
    finally:
        if conn is not None:
            with contextlib.suppress(StorageError):
                conn.close()


def status_facts(db: Database) -> dict[str, Any]:
    """What `lore db status` shows, as one document (raises a ``UserError``)."""
    from lore_gateway.storage import schema
    from lore_gateway.worker import jobs

    facts: dict[str, Any] = {"backend": db.backend, "url": db.url}
    if not db.exists():
        return facts | {"exists": False}
    with connected(db) as conn:
        started = time.perf_counter()
        version = schema.current_version(conn)
        facts["round_trip_ms"] = round((time.perf_counter() - started) * 1000, 2)
        facts.update(exists=True, schema_version=version,
                     latest_version=schema.latest_version(conn))
        if version == 0:
            return facts
        facts["rows"] = {t: _count(conn, t) for t in STATUS_TABLES}
        facts["tenants"] = _count(conn, "(SELECT DISTINCT tenant FROM turns) t")
        facts["worker_jobs"] = jobs.counts(conn)
        facts["unfinished_copies"] = unfinished_copies(conn)
        if db.backend == "postgres":
            facts.update(_postgres_facts(conn, db))
    return facts


def _count(conn: Connection, table: str) -> int:
    row = conn.execute(f"SELECT count(*) FROM {table}").fetchone()
    return int(row[0]) if row else 0


def unfinished_copies(conn: Connection) -> list[str]:
    """Sources of ``lore db copy`` runs into this database that did not finish."""
    from lore_gateway.storage.dbcopy import Plan, state_key_prefix

    found = []
    for _, value in conn.execute("SELECT key, value FROM kv WHERE key LIKE ?",
                                 (state_key_prefix() + "%",)):
        plan = Plan.from_json(str(value))
        if plan.finished_at is None:
            found.append(plan.source)
    return found


def _postgres_facts(conn: Connection, db: Database) -> dict[str, Any]:
    from lore_gateway.storage.postgres import PostgresDatabase

    server = conn.execute("SHOW server_version").fetchone()
    vector = conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'"
                          ).fetchone()
    size = conn.execute("SELECT pg_database_size(current_database())").fetchone()
    return {"server_version": str(server[0]) if server else None,
            "pgvector": str(vector[0]) if vector else None,
            "size_bytes": int(size[0]) if size else None,
            "pool_max": db.pool_max if isinstance(db, PostgresDatabase) else None}


@db_app.command("status")
def status_command(
    url: str | None = typer.Option(None, "--url", help=URL_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Which database, its schema version, what it holds, and copies left unfinished."""
    facts = status_facts(database(url))
    if as_json:
        output.print_json(facts)
        return
    if not facts.get("exists", True) or not facts.get("schema_version"):
        output.line(f"{facts['url']}: no memory yet (made on the first `lore serve` or "
                    "`lore db migrate`)")
        return
    pairs: list[tuple[str, object]] = [
        ("database", f"{facts['backend']}: {facts['url']}"),
        ("schema", _schema_line(facts)),
        ("round trip", f"{facts['round_trip_ms']:g} ms"),
    ]
    if facts["backend"] == "postgres":
        pairs += [("server", f"PostgreSQL {facts['server_version']}, pgvector "
                             f"{facts['pgvector'] or 'MISSING'}"),
                  ("size", _size(facts["size_bytes"])),
                  ("pool", f"at most {facts['pool_max']} connections per gateway process "
                           "(LORE_DATABASE_POOL_MAX)")]
    rows = facts["rows"]
    pairs += [("tenants", facts["tenants"]),
              *((table, f"{count:,}") for table, count in rows.items()),
              ("worker jobs", ", ".join(f"{n} {state}" for state, n in
                                        facts["worker_jobs"].items()))]
    for source in facts["unfinished_copies"]:
        pairs.append(("unfinished copy", f"from {source}: run the same `lore db copy` again "
                                         "to finish it"))
    output.print_fields(pairs, title="lore db status")


def _schema_line(facts: dict[str, Any]) -> str:
    have, want = facts["schema_version"], facts["latest_version"]
    if have == want:
        return f"version {have} (current)"
    if have < want:
        return f"version {have}; {want} after `lore db migrate` (or the next gateway start)"
    return f"version {have}, newer than this lore-gateway ({want}): upgrade lore-gateway"


def _size(count: int | None) -> str:
    from lore_gateway.cli.status import size

    return "unknown" if count is None else size(count)


@db_app.command("copy")
def copy_command(
    source: str = typer.Option(..., "--from", help="The memory to copy, e.g. "
                               "sqlite:///home/me/.local/share/lore/lore.db."),
    target: str = typer.Option(..., "--to", help="Where to copy it, e.g. "
                               "postgresql://lore@db.internal/lore (migrated first)."),
    tenant: str | None = typer.Option(None, "--tenant", help="Store the source's personal "
                                      "memory under this tenant (team mode: the name "
                                      "`lore keys create` gets)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Copy a whole memory into another database (a personal SQLite memory into a
    team's Postgres, say). Resumable: run it again after an interruption and it continues.
    Verified: every table's rows are counted in both at the end (exit code 1 if any
    differ). Stop the gateways writing to the source first."""
    from lore_gateway.memory.tenancy.keys import valid_tenant_name
    from lore_gateway.storage import dbcopy

    if tenant is not None and not valid_tenant_name(tenant):
        raise fail(f"--tenant {tenant!r} is not a tenant name: use 1-64 letters, digits, '.', "
                   "'_', '@' or '-'")
    src, dst = database(source), database(target)
    if not src.exists():
        raise fail(f"the source {src.url} does not exist")
    for db, what in ((src, "the source"), (dst, "the target")):
        with connected(db, what=what):
            pass
    try:
        with output.stages() as update:
            result = dbcopy.copy(src, dst, tenant=tenant, progress=update)
    except dbcopy.CopyError as exc:
        raise fail(str(exc)) from None
    except StorageError as exc:
        raise fail(f"the copy stopped: {_brief(exc)}; what was committed is kept, and the "
                   "same command resumes after the fix") from None
    if as_json:
        output.print_json({"ok": result.ok, "resumed": result.resumed,
                           "seconds": round(result.seconds, 2),
                           "offsets": result.plan.offsets, "tenant": result.plan.tenant,
                           "tables": [{"table": c.table, "source": c.source,
                                       "target": c.target, "copied_now": c.copied_now}
                                      for c in result.counts]})
    else:
        output.print_table(
            [output.Column("table"), output.Column("source", wrap=False),
             output.Column("target", wrap=False), output.Column("copied now", wrap=False),
             output.Column("check", wrap=False)],
            [(c.table, f"{c.source:,}", f"{c.target:,}", f"{c.copied_now:,}",
              "ok" if c.ok else "DIFFERS") for c in result.counts],
            title=f"lore db copy {src.url} → {dst.url}")
        moved = "" if not any(result.plan.offsets.values()) else (
            " Ids were shifted past the target's own (" + ", ".join(
                f"{t} +{n:,}" for t, n in result.plan.offsets.items() if n) + ").")
        verdict = ("Verified: every table has the same rows in both." if result.ok else
                   "Counts differ: run the same command again; if they still differ, the "
                   "target held rows with the same keys.")
        output.line(f"{'Resumed and c' if result.resumed else 'C'}opied in "
                    f"{result.seconds:.1f} s. {verdict}{moved}")
    if not result.ok:
        raise typer.Exit(1)
