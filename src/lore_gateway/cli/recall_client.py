"""``lore recall`` asking the running gateway (``POST /lore/recall``, ``local_recall.py``).

The gateway has the database open and the model loaded, so it answers in a few
tens of milliseconds where a cold local search first spends a second or more
starting up. Whenever the gateway cannot answer this exact question (none is
running, it serves another data directory, an explicit ``--tenant``), the
caller searches locally; ``None`` says so. In team mode the gateway key
(``--key-env VAR``, else ``LORE_KEY``) goes along and selects the tenant.
"""

from __future__ import annotations

import http.client
import json
import os
from typing import Any

from lore_gateway.cli.scope import DEFAULT_KEY_ENV
from lore_gateway.config import Settings
from lore_gateway.local_recall import LOCAL_RECALL_PATH

# Connecting to a loopback port that nobody listens on fails at once; a search
# the gateway accepted may queue behind others under load.
TIMEOUT_S = 10.0


def ask_gateway(settings: Settings, *, query: str, scope: str, project: str,
                session: str | None, limit: int, tenant: str | None,
                key_env: str | None) -> dict[str, Any] | None:
    """The gateway's answer, or ``None`` when the CLI should search locally."""
    team = settings.tenancy == "keys"
    if tenant is not None or session or (key_env is not None and not team):
        # An owner's explicit choice of tenant, or a session prefix to resolve: local.
        return None
    headers = {"content-type": "application/json"}
    if team:
        key = os.environ.get(key_env or DEFAULT_KEY_ENV, "").strip()
        if not key:
            return None  # the local path explains what is missing
        headers["x-lore-key"] = key
    body = json.dumps({"db": settings.database.url, "query": query, "scope": scope,
                       "project": project, "session": session or "", "limit": limit})
    connection = http.client.HTTPConnection(settings.host, settings.port, timeout=TIMEOUT_S)
    try:
        connection.request("POST", LOCAL_RECALL_PATH, body=body, headers=headers)
        response = connection.getresponse()
        payload = response.read()
    except (OSError, http.client.HTTPException):
        return None
    finally:
        connection.close()
    if response.status != 200:
        return None
    try:
        answer: dict[str, Any] = json.loads(payload)
    except ValueError:
        return None
    return answer
