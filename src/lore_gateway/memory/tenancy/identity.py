"""Who a request belongs to: tenant, project and session (pure functions).

The tenant depends on the mode (docs/memory.md): in personal mode (the default)
every request is the one user's; in team mode the gateway key decides. Provider
credentials never identify anyone. Session and project come from what the client
tells us, most explicit first.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

from lore_gateway.errors import GatewayError
from lore_gateway.memory.store.records import Identity
from lore_gateway.memory.tenancy.fingerprint import (
    conversation,
    fingerprint_session,
    instruction_texts,
    item_content,
    texts,
)
from lore_gateway.memory.tenancy.keys import KEY_HEADER

# The one tenant of personal mode, and the tenant older databases' credential
# tenants were merged into (schema migration "personal tenant").
PERSONAL = "personal"
UNKNOWN_PROJECT = "unknown"
# lore-spec A.4 caps the project header at 1024 characters; session ids get the
# same treatment so a hostile header cannot bloat every stored row.
MAX_PROJECT_CHARS = 1024
MAX_SESSION_CHARS = 256

# Explicit session headers, ours first, then each client's own (the value is the
# client's conversation id, the same on every request of it):
# - Codex sends session-id and thread-id; older builds session_id and
#   conversation_id (codex-rs core/src/client.rs);
# - Claude Code sends X-Claude-Code-Session-Id;
# - OpenCode (1.x, session/llm/request.ts) sends X-Session-Id and
#   x-session-affinity, both its session id (``ses_…``), and x-opencode-session
#   instead of both when its own opencode provider is used.
SESSION_HEADERS = (
    "x-lore-session-id",
    "session-id",
    "thread-id",
    "session_id",
    "conversation_id",
    "x-claude-code-session-id",
    "x-session-id",
    "x-opencode-session",
    "x-session-affinity",
)

_CWD_RE = re.compile(r"<cwd>\s*([^<\n]+?)\s*</cwd>")
_PRIMARY_WD_RE = re.compile(r"^\s*(?:-\s*)?Primary working directory:\s*(\S[^\n]*?)\s*$", re.M)
_WD_RE = re.compile(
    r"^\s*(?:-\s*)?(?:Working directory|cwd):\s*(/[^\n]*?|[A-Za-z]:\\[^\n]*?)\s*$", re.M
)
# Gemini CLI 0.61's <session_context> (core/utils/environmentContext.js) lists
# its workspace directories, the one it was started in first, then any added
# with --include-directories:
#   - **Workspace Directories:**
#     - /home/dev/shop
_WORKSPACE_RE = re.compile(r"^- \*\*Workspace Directories:\*\*\n[ \t]*- ([^\n]*?)[ \t]*$", re.M)

# --- tenant --------------------------------------------------------------------------


class Tenancy(Protocol):
    """Decides the tenant of a request from its headers, or refuses it."""

    mode: str

    def tenant(self, headers: Mapping[str, str]) -> str: ...


class PersonalTenancy:
    """Personal mode: every request through this gateway is one person's memory.

    The credential a request carries (an API key, a rotating OAuth token, a ChatGPT
    login) says which *provider account* pays, not which person is asking, so it is
    not used at all: nothing derived from it is stored.
    """

    mode = "personal"

    def tenant(self, headers: Mapping[str, str]) -> str:
        del headers
        return PERSONAL


class KeyTenancy:
    """Team mode: the gateway key in ``X-Lore-Key`` selects the tenant.

    Provider credentials never do (they are unverifiable here: a JWT claim can be
    forged). A request without a valid key is refused, never stored under a
    catch-all tenant.
    """

    mode = "keys"

    def __init__(self, lookup: Callable[[str], str | None]) -> None:
        self._lookup = lookup

    def tenant(self, headers: Mapping[str, str]) -> str:
        key = headers.get(KEY_HEADER, "").strip()
        if not key:
            raise GatewayError(401, "authentication_error", MISSING_KEY_MESSAGE, retry=False)
        tenant = self._lookup(key)
        if tenant is None:
            raise GatewayError(401, "authentication_error", INVALID_KEY_MESSAGE, retry=False)
        return tenant


MISSING_KEY_MESSAGE = (
    "This lore gateway runs in team mode (LORE_TENANCY=keys) and the request carries no "
    "gateway key. Ask the gateway's owner for one (`lore keys create <name>`), then send it "
    "in the X-Lore-Key header: `LORE_KEY=<key> lore run codex|claude`, or `lore setup "
    "codex|claude` with LORE_KEY set."
)
INVALID_KEY_MESSAGE = (
    "The X-Lore-Key header holds no valid gateway key for this lore gateway (unknown or "
    "revoked). Check LORE_KEY, or ask the gateway's owner for a new key (`lore keys create "
    "<name>`; `lore keys list` shows the live ones)."
)


# --- session -------------------------------------------------------------------------


def session_for(headers: Mapping[str, str], body: Mapping[str, Any], project: str) -> str:
    """The session the client named (a header, then the body's own ids), else a
    fingerprint of the conversation's first message (``memory/tenancy/fingerprint.py``)."""
    for name in SESSION_HEADERS:
        value = headers.get(name, "").strip()
        if value:
            return value[:MAX_SESSION_CHARS]
    cache_key = body.get("prompt_cache_key")
    if isinstance(cache_key, str) and cache_key.strip():
        return cache_key.strip()[:MAX_SESSION_CHARS]
    conversation = _responses_conversation(body)
    if conversation:
        return conversation[:MAX_SESSION_CHARS]
    metadata_session = _claude_metadata_session(body)
    if metadata_session:
        return metadata_session[:MAX_SESSION_CHARS]
    return fingerprint_session(body, project)


def _responses_conversation(body: Mapping[str, Any]) -> str | None:
    """The Responses API's ``conversation`` (an id, or an object with one): a
    conversation the provider keeps, which the OpenAI Agents SDK passes along."""
    value = body.get("conversation")
    if isinstance(value, dict):
        value = value.get("id")
    return value.strip() if isinstance(value, str) and value.strip() else None


def _claude_metadata_session(body: Mapping[str, Any]) -> str | None:
    metadata = body.get("metadata")
    user_id = metadata.get("user_id") if isinstance(metadata, dict) else None
    if not isinstance(user_id, str) or not user_id.startswith("{"):
        return None
    try:
        parsed = json.loads(user_id)
    except ValueError:
        return None
    session = parsed.get("session_id") if isinstance(parsed, dict) else None
    return session if isinstance(session, str) and session else None


# --- project -------------------------------------------------------------------------


def project_for(headers: Mapping[str, str], body: Mapping[str, Any]) -> str:
    explicit = headers.get("x-lore-project", "").strip()
    if explicit:
        return _normalise_path(explicit)
    # In one pass over the texts: a <cwd> anywhere wins, then the first "Primary
    # working directory" (or Gemini CLI's first workspace directory), then the
    # first other working-directory line.
    primary = other = None
    for text in _context_texts(body):
        match = _CWD_RE.search(text)
        if match:
            return _normalise_path(match.group(1))
        if primary is None:
            primary = _PRIMARY_WD_RE.search(text) or _WORKSPACE_RE.search(text)
            if primary is None and other is None:
                other = _WD_RE.search(text)
    found = primary or other
    return _normalise_path(found.group(1)) if found else UNKNOWN_PROJECT


def _context_texts(body: Mapping[str, Any]) -> Iterator[str]:
    """System prompt, instructions and every developer/system/user item's text."""
    yield from instruction_texts(body)
    items = conversation(body)
    if isinstance(items, list):
        for item in items:
            if isinstance(item, dict) and item.get("role") in ("system", "developer", "user"):
                yield from texts(item_content(item))


def _normalise_path(path: str) -> str:
    path = path.strip().strip("`'\"")
    if len(path) > 1:
        path = path.rstrip("/\\") or path[0]
    return path[:MAX_PROJECT_CHARS]


# --- all three -----------------------------------------------------------------------


def identify(
    protocol: str, headers: Mapping[str, str], body: Mapping[str, Any], *, tenancy: Tenancy
) -> Identity:
    """Tenant, project and session of one request.

    ``headers`` must have lower-case names. ``protocol`` is accepted for the
    contract's sake and for future protocol-specific rules; today every rule is
    recognised by its own shape (a Codex header, an Anthropic ``system``).
    """
    del protocol
    tenant = tenancy.tenant(headers)  # first: a refused request costs nothing more
    project = project_for(headers, body)
    return Identity(
        tenant=tenant,
        project=project,
        session=session_for(headers, body, project),
    )
