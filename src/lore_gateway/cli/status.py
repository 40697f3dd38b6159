"""``lore status [--json]``: is the gateway up, where does it send traffic, what is stored.

Asks the running gateway (``GET /lore/status``, loopback only); when nothing answers,
the same document is built from the settings and the database file, with
``gateway.running = false``. ``banner`` turns the document into the few lines
``lore serve`` prints at start.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from typing import Any

import orjson
import typer

from lore_gateway.cli import output
from lore_gateway.cli.main import app
from lore_gateway.config import Settings, lenient_settings
from lore_gateway.obs import status

STATUS_TIMEOUT_S = 2.0


def fetch_live(settings: Settings) -> dict[str, Any] | None:
    """The running gateway's status document, or None when none answers."""
    try:
        with urllib.request.urlopen(settings.base_url + status.ROUTE,
                                    timeout=STATUS_TIMEOUT_S) as response:
            document = orjson.loads(response.read(1024 * 1024))
    except (OSError, ValueError, urllib.error.URLError):
        return None
    return document if isinstance(document, dict) and "gateway" in document else None


def collect(settings: Settings) -> dict[str, Any]:
    live = fetch_live(settings)
    if live is not None:
        return live
    document = status.snapshot(settings)
    from lore_gateway.cli.preflight import port_problem
    from lore_gateway.cli.run import probe_health

    health = probe_health(settings.base_url)
    if health is not None:  # a gateway without the status route (an older version)
        document["gateway"].update(running=True, version=health.get("version"))
    elif problem := port_problem(settings):
        document["gateway"]["problem"] = problem
    return document


def size(count: int) -> str:
    value = float(count)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1024 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{count} B"


def duration(seconds: float) -> str:
    seconds = int(seconds)
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {minutes}m"
    return f"{minutes}m {secs}s" if minutes else f"{secs}s"


def _on(flag: object) -> str:
    return "on" if flag else "off"


def _worker(section: dict[str, Any]) -> str:
    if section.get("state") != "on":
        return "off"
    left = [f"{tenant} {u['budget_left']:,} left"
            for tenant, u in section.get("today", {}).items()]
    budget = f"{section.get('daily_tokens_per_tenant', 0):,} tokens/day per tenant"
    jobs = section.get("jobs", {})
    models = ", ".join(f"{k} {v}" for k, v in section.get("models", {}).items())
    return (f"on, models {models}; {budget}" + (f" ({', '.join(left)})" if left else "")
            + f"; jobs {jobs.get('queued', 0)} queued, {jobs.get('failed', 0)} failed")


def _compaction(section: dict[str, Any]) -> str:
    """Usage scaling and the compactions answered from memory (docs/context.md)."""
    caps = section.get("client_caps", {})
    scaling = (f"usage capped (Claude Code {caps.get('claude-code', 0):,}, Codex "
               f"{caps.get('codex', 0):,})" if section.get("usage_scaling") else "usage real")
    if not section.get("from_memory"):
        return f"{scaling}; answered upstream"
    answered = sum(section.get("answered", {}).values())
    passed = sum(section.get("passed_through", {}).values())
    return f"{scaling}; {answered} answered from memory, {passed} passed through"


def _context(section: dict[str, Any]) -> str:
    if not section.get("enabled"):
        return "off"
    text = f"on, budget {section.get('budget_share', 0):.0%} of the window"
    latest = section.get("latest")
    if latest:
        share = latest.get("cache_read_share")
        text += (f"; {output.plural(int(section.get('sessions_managed', 0)), 'session')}"
                 f" managed; latest {str(latest['session'])[:16]}: layer {latest['layer']},"
                 f" cache reads {'n/a' if share is None else f'{share:.0%}'}")
    return text


def _database(db: dict[str, Any]) -> str:
    if not db.get("exists"):
        return f"{db.get('path')} not created yet (made on first start)"
    if "error" in db:
        return f"{size(db.get('bytes', 0))}, {db['error']}"
    return (f"{size(db['bytes'])}, {output.plural(db['sessions'], 'session')}, "
            f"{output.plural(db['turns'], 'turn')}, {output.plural(db['messages'], 'message')}")


def _embeddings(document: dict[str, Any]) -> str:
    if not document["embeddings"].get("enabled"):
        return "off"
    backlog = document["database"].get("embedding_backlog", 0)
    return f"on, backlog {output.plural(int(backlog or 0), 'message')}"


def _amnesia(section: dict[str, Any]) -> str:
    """Off, or what is kept out of memory (``lore amnesia``)."""
    rows = section.get("entries") or []
    if "error" in section:
        return f"unknown ({section['error']})"
    if not rows:
        return "off"
    return "on: " + "; ".join(str(r["covers"]) for r in rows) + " (nothing of them is stored)"


def fields(document: dict[str, Any]) -> list[tuple[str, str]]:
    gateway = document["gateway"]
    if gateway.get("running"):
        state = f"up, version {gateway.get('version')}"
        if gateway.get("uptime_s") is not None:
            state += f", for {duration(gateway['uptime_s'])} (pid {gateway.get('pid')})"
    else:
        state = "down: " + gateway.get("problem", "nothing answers; `lore serve` starts it")
    storage = document["storage"]
    store = _on(storage.get("enabled"))
    if "queue_depth" in storage:
        store += f", {output.plural(storage['queue_depth'], 'turn')} queued"
    rows = [("gateway", state), ("listen", gateway.get("listen", "")),
            *((f"upstream {name}", url) for name, url in document["upstreams"].items()),
            ("data dir", document["data_dir"]), ("database", _database(document["database"])),
            ("storage", store), ("recall", _on(document["recall"].get("enabled"))),
            ("embeddings", _embeddings(document)), ("worker", _worker(document.get("worker", {}))),
            ("context", _context(document.get("context", {}))),
            ("tenancy", str(document.get("tenancy", "personal")))]
    if "amnesia" in document:
        rows.append(("amnesia", _amnesia(document["amnesia"])))
    if "compaction" in document:
        rows.append(("compaction", _compaction(document["compaction"])))
    rows += [("settings", problem) for problem in document.get("settings_problems", [])]
    return rows


def banner(document: dict[str, Any]) -> list[str]:
    """The startup banner: the status essentials in a few lines."""
    gateway, url = document["gateway"], document["gateway"]["listen"]
    rows = [
        *((f"upstream {name}", u) for name, u in document["upstreams"].items()),
        ("data dir", document["data_dir"]),
        ("database", _database(document["database"])),
        ("memory", f"storage {_on(document['storage'].get('enabled'))}, recall "
                   f"{_on(document['recall'].get('enabled'))}, embeddings "
                   f"{_embeddings(document)}"),
        ("worker", f"{_worker(document.get('worker', {}))}; tenancy "
                   f"{document.get('tenancy')}"),
        ("memory browser", f"{url}/ui"),
        ("agents", "lore run codex | lore run claude"),
        ("SDKs", f"base_url {url}/v1 (OpenAI), {url} (Anthropic)"),
    ]
    return [f"lore-gateway {gateway.get('version')} listening on {url}",
            *(f"  {name:<20}{value}" for name, value in rows)]


@app.command("status")
def status_command(
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Show whether the gateway is up, and what it holds.

    Version, uptime, listen address, upstreams, data dir, database size and counts,
    embedding backlog, worker, recall, storage, tenancy and amnesia; from the running
    gateway, or from the disk when none answers."""
    settings, problems = lenient_settings()
    document = collect(settings)
    if problems:
        document["settings_problems"] = list(problems.values())
    if as_json:
        output.print_json(document)
        return
    output.print_fields(fields(document), title="lore status")
