"""Who a request belongs to: tenant, project and session (pure functions).

Tenant isolation rests on the credential: memory is partitioned by an HMAC of the
credential under a local random salt, so the database never holds the secret and a
leaked database does not reveal which key wrote which rows. Session and project
come from what the client tells us, most explicit first (docs/memory.md).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import hmac
import json
import os
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from lore_gateway.memory.records import Identity

ANONYMOUS = "anonymous"
UNKNOWN_PROJECT = "unknown"
SALT_FILE = "tenant.salt"
SALT_BYTES = 32
# lore-spec A.4 caps the project header at 1024 characters; session ids get the
# same treatment so a hostile header cannot bloat every stored row.
MAX_PROJECT_CHARS = 1024
MAX_SESSION_CHARS = 256

# Explicit session headers, most specific first. Codex sends session-id and
# thread-id (older builds session_id); Claude Code sends X-Claude-Code-Session-Id.
SESSION_HEADERS = (
    "x-lore-session-id",
    "session-id",
    "thread-id",
    "session_id",
    "x-claude-code-session-id",
)

_CWD_RE = re.compile(r"<cwd>\s*([^<\n]+?)\s*</cwd>")
_PRIMARY_WD_RE = re.compile(r"^\s*(?:-\s*)?Primary working directory:\s*(\S[^\n]*?)\s*$", re.M)
_WD_RE = re.compile(
    r"^\s*(?:-\s*)?(?:Working directory|cwd):\s*(/[^\n]*?|[A-Za-z]:\\[^\n]*?)\s*$", re.M
)
# Harness-generated user items: identical across conversations, so useless as a
# fingerprint of one conversation.
_BOILERPLATE_PREFIXES = (
    "<environment_context>",
    "<user_instructions>",
    "<system-reminder>",
    "<permissions instructions>",
    "# AGENTS.md instructions",
    "<skills_instructions>",
)


# --- salt ----------------------------------------------------------------------------


def load_salt(data_dir: Path) -> bytes:
    """Read the tenant salt, creating it (owner-only) on first use.

    Creation is exclusive, so two processes starting together agree on one salt.
    """
    data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = data_dir / SALT_FILE
    with contextlib.suppress(FileExistsError):
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        try:
            os.write(fd, os.urandom(SALT_BYTES).hex().encode("ascii"))
        finally:
            os.close(fd)
    raw = path.read_text(encoding="ascii").strip()
    if len(raw) < 2 * SALT_BYTES:
        raise RuntimeError(
            f"{path} is damaged ({len(raw)} characters, expected {2 * SALT_BYTES} hex); "
            "restore it from a backup, or delete it to start a new salt (existing "
            "memory then becomes unreachable through the proxy)"
        )
    return bytes.fromhex(raw)


# --- tenant --------------------------------------------------------------------------


def tenant_for(headers: Mapping[str, str], *, salt: bytes) -> str:
    """``t-<hex>`` from the request's credential, or ``anonymous`` without one."""
    kind_value = _credential(headers)
    if kind_value is None:
        return ANONYMOUS
    digest = hmac.new(salt, kind_value.encode("utf-8"), hashlib.sha256).hexdigest()
    return f"t-{digest[:24]}"


def tenant_for_credential(credential: str, *, salt: bytes) -> str:
    """The tenant a bare API key maps to (the CLI's ``--key-env``)."""
    return tenant_for({"authorization": f"Bearer {credential}"}, salt=salt)


def _credential(headers: Mapping[str, str]) -> str | None:
    """The stable identifier of the caller, tagged with its kind.

    A ChatGPT login sends a short-lived JWT access token; its signed claim
    ``chatgpt_account_id`` is stable across refreshes, so it identifies the tenant.
    The ``chatgpt-account-id`` header alone is not trusted (the client sets it
    freely); it only counts when the token's own claim agrees. An API key stands for
    itself whichever header carried it, so the same key is one tenant on every
    protocol.
    """
    bearer = _bearer(headers.get("authorization", ""))
    api_key = headers.get("x-api-key", "").strip() or headers.get("api-key", "").strip()
    if bearer:
        account = _jwt_account(bearer)
        if account is not None:
            return f"chatgpt-account:{account}"
        return f"key:{bearer}"
    if api_key:
        return f"key:{api_key}"
    return None


def _bearer(value: str) -> str:
    scheme, _, token = value.strip().partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def _jwt_account(token: str) -> str | None:
    parts = token.split(".")
    if len(parts) != 3 or not parts[0].startswith("eyJ"):
        return None
    try:
        padded = parts[1] + "=" * (-len(parts[1]) % 4)
        claims = json.loads(base64.urlsafe_b64decode(padded))
    except (binascii.Error, ValueError):
        return None
    auth = claims.get("https://api.openai.com/auth") if isinstance(claims, dict) else None
    account = auth.get("chatgpt_account_id") if isinstance(auth, dict) else None
    return account if isinstance(account, str) and account else None


# --- session -------------------------------------------------------------------------


def session_for(headers: Mapping[str, str], body: Mapping[str, Any], project: str) -> str:
    for name in SESSION_HEADERS:
        value = headers.get(name, "").strip()
        if value:
            return value[:MAX_SESSION_CHARS]
    cache_key = body.get("prompt_cache_key")
    if isinstance(cache_key, str) and cache_key.strip():
        return cache_key.strip()[:MAX_SESSION_CHARS]
    metadata_session = _claude_metadata_session(body)
    if metadata_session:
        return metadata_session[:MAX_SESSION_CHARS]
    return fingerprint_session(body, project)


def fingerprint_session(body: Mapping[str, Any], project: str) -> str:
    """``fp-<hex>``: a hash of the project and the conversation's first user message.

    Clients resend the whole conversation each turn, so its first real user message
    is stable for the life of the conversation. The project is mixed in so that
    "say hi" in two repositories is two sessions.
    """
    first = next(_user_texts(body), "")
    digest = hashlib.sha256(f"{project}\0{first}".encode()).hexdigest()
    return f"fp-{digest[:20]}"


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


def _user_texts(body: Mapping[str, Any]) -> Iterator[str]:
    """Texts of user messages in order, harness boilerplate skipped."""
    items = body.get("input", body.get("messages"))
    if isinstance(items, str):
        if items.strip():
            yield items.strip()
        return
    if not isinstance(items, list):
        return
    for item in items:
        if not isinstance(item, dict) or item.get("role") != "user":
            continue
        for text in _texts(item.get("content")):
            if text and not text.startswith(_BOILERPLATE_PREFIXES):
                yield text


def _texts(content: Any) -> Iterator[str]:
    if isinstance(content, str):
        yield content.strip()
    elif isinstance(content, list):
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                yield part["text"].strip()


# --- project -------------------------------------------------------------------------


def project_for(headers: Mapping[str, str], body: Mapping[str, Any]) -> str:
    explicit = headers.get("x-lore-project", "").strip()
    if explicit:
        return _normalise_path(explicit)
    for text in _context_texts(body):
        match = _CWD_RE.search(text)
        if match:
            return _normalise_path(match.group(1))
    for pattern in (_PRIMARY_WD_RE, _WD_RE):
        for text in _context_texts(body):
            match = pattern.search(text)
            if match:
                return _normalise_path(match.group(1))
    return UNKNOWN_PROJECT


def _context_texts(body: Mapping[str, Any]) -> Iterator[str]:
    """System prompt, instructions and every developer/system/user item's text."""
    for key in ("instructions", "system"):
        yield from _texts(body.get(key))
    items = body.get("input", body.get("messages"))
    if isinstance(items, list):
        for item in items:
            if isinstance(item, dict) and item.get("role") in ("system", "developer", "user"):
                yield from _texts(item.get("content"))


def _normalise_path(path: str) -> str:
    path = path.strip().strip("`'\"")
    if len(path) > 1:
        path = path.rstrip("/\\") or path[0]
    return path[:MAX_PROJECT_CHARS]


# --- all three -----------------------------------------------------------------------


def identify(
    protocol: str, headers: Mapping[str, str], body: Mapping[str, Any], *, salt: bytes
) -> Identity:
    """Tenant, project and session of one request.

    ``headers`` must have lower-case names. ``protocol`` is accepted for the
    contract's sake and for future protocol-specific rules; today every rule is
    recognised by its own shape (a Codex header, an Anthropic ``system``).
    """
    del protocol
    project = project_for(headers, body)
    return Identity(
        tenant=tenant_for(headers, salt=salt),
        project=project,
        session=session_for(headers, body, project),
    )
