"""What the worker is doing, for the banner, ``lore doctor`` and ``lore status``."""

from __future__ import annotations

import time
from typing import Any

from lore_gateway.config import Settings
from lore_gateway.storage.base import Connection
from lore_gateway.worker import jobs


def worker_settings(settings: Settings) -> dict[str, Any]:
    """What the settings say about background calls (no database needed)."""
    return {
        "enabled": settings.worker,
        "models": {"anthropic": settings.worker_model_anthropic,
                   "openai": settings.worker_model_openai,
                   "chatgpt": settings.worker_model_chatgpt,
                   "gemini": settings.worker_model_gemini},
        "daily_tokens_per_tenant": settings.worker_daily_tokens,
    }


def job_facts(conn: Connection, settings: Settings, now: float) -> dict[str, Any]:
    """Jobs by state and today's usage per tenant, from the database."""
    usage = jobs.usage_today(conn, now)
    return {
        "jobs": jobs.counts(conn),
        "today": {tenant: {**u, "budget_left": max(
            0, settings.worker_daily_tokens - u["tokens_in"] - u["tokens_out"])}
            for tenant, u in usage.items()},
    }


def describe(settings: Settings) -> str:
    """One line for the startup banner and ``lore doctor``."""
    if not settings.worker:
        return "background calls: off (LORE_WORKER=off; distillation is extractive, no model)"
    return (f"background calls: on, after each response, to the session's provider "
            f"(models: anthropic {settings.worker_model_anthropic}, openai "
            f"{settings.worker_model_openai}, chatgpt {settings.worker_model_chatgpt}, "
            f"gemini {settings.worker_model_gemini}); "
            f"budget {settings.worker_daily_tokens:,} tokens/day per tenant")


def status_from_db(settings: Settings) -> dict[str, Any]:
    """Worker facts from the settings and the database, for another process
    (``lore status``, ``lore doctor``): no running gateway needed."""
    from lore_gateway.storage import db

    facts = worker_settings(settings)
    database = settings.database
    if not database.exists():
        return facts | {"jobs": {"queued": 0, "done": 0, "failed": 0, "running": 0},
                        "today": {}}
    conn = db.connect(database, readonly=True)
    try:
        facts.update(job_facts(conn, settings, time.time()))
    except Exception as exc:  # an older schema without the worker tables
        facts["error"] = f"no worker tables in {database.url}: {exc}"
    finally:
        conn.close()
    return facts
