"""Tenant, project and session from the requests real clients sent (fixtures)."""

from __future__ import annotations

import base64
import json
import stat
from pathlib import Path
from typing import Any

import pytest

from lore_gateway.memory.identity import identify, load_salt, tenant_for

FIXTURES = Path(__file__).resolve().parents[3] / "shared" / "fixtures"
SALT = b"\x07" * 32


def captured(name: str) -> tuple[dict[str, str], dict[str, Any]]:
    path = next(FIXTURES.glob(f"*/captured-requests/{name}"))
    request = json.loads(path.read_text())
    headers = {k.lower(): v for k, v in request["headers"].items()}
    return headers, request["body"] if isinstance(request.get("body"), dict) else {}


CODEX_APIKEY = ["apikey_custom_provider__turn1_request.json",
                "apikey_custom_provider__after_unknown_recall_call_request.json"]
CODEX_CHATGPT = ["chatgpt_login_custom_provider__backend_api_codex_responses_request.json",
                 "chatgpt_login_custom_provider__after_unknown_recall_call_request.json"]
CLAUDE = ["messages_turn1_request.json", "messages_after_unknown_recall_tool_use_request.json"]


@pytest.mark.parametrize("name", CODEX_APIKEY + CODEX_CHATGPT)
def test_codex_session_is_its_session_header_and_project_its_cwd(name: str) -> None:
    headers, body = captured(name)
    ident = identify("responses", headers, body, salt=SALT)
    assert ident.session == headers["session-id"] == body["prompt_cache_key"]
    assert ident.project == "/home/dev/project"


@pytest.mark.parametrize("name", CLAUDE)
def test_claude_code_session_header_and_primary_working_directory(name: str) -> None:
    headers, body = captured(name)
    ident = identify("anthropic", headers, body, salt=SALT)
    assert ident.session == "db19ad6e-8e38-40d7-8fb5-2cdd1891bc27"
    assert ident.project == "/home/dev/project"


def test_a_turn_and_its_follow_up_share_one_identity() -> None:
    for pair in (CODEX_APIKEY, CODEX_CHATGPT, CLAUDE):
        first, second = (identify("x", *captured(name), salt=SALT) for name in pair)
        assert first == second


def test_zstd_chatgpt_request_and_websocket_attempt() -> None:
    headers, body = captured("chatgpt_login_builtin_provider__zstd_request_decompressed.json")
    ident = identify("codex", headers, body, salt=SALT)
    assert ident.session == "01a22c2c-81b3-7cb2-a04c-492f0b6ba529"
    assert ident.project == "/home/dev/project"
    ws_headers, ws_body = captured("chatgpt_login_builtin_provider__websocket_upgrade_attempt.json")
    ws = identify("codex", ws_headers, ws_body, salt=SALT)
    assert (ws.session, ws.project, ws.tenant) == (ident.session, "unknown", ident.tenant)


def test_tenant_is_a_salted_hash_never_the_credential() -> None:
    apikey_headers, _ = captured(CODEX_APIKEY[0])
    claude_headers, _ = captured(CLAUDE[0])
    chatgpt_headers, _ = captured(CODEX_CHATGPT[0])
    apikey = tenant_for(apikey_headers, salt=SALT)
    # The same key ("dummy") through Bearer and through x-api-key is one tenant.
    assert apikey == tenant_for(claude_headers, salt=SALT)
    assert apikey.startswith("t-") and "dummy" not in apikey
    chatgpt = tenant_for(chatgpt_headers, salt=SALT)
    assert chatgpt not in (apikey, "anonymous")
    assert tenant_for(apikey_headers, salt=b"\x08" * 32) != apikey
    assert tenant_for({}, salt=SALT) == "anonymous"
    assert tenant_for({"authorization": "Bearer other-key"}, salt=SALT) != apikey


def _jwt(account: str, nonce: str) -> str:
    def part(obj: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).decode().rstrip("=")
    claims = {"iat": nonce, "https://api.openai.com/auth": {"chatgpt_account_id": account}}
    return f"{part({'alg': 'none'})}.{part(claims)}.c2ln"


def test_chatgpt_tenant_follows_the_signed_account_claim_not_the_header() -> None:
    refreshed = [{"authorization": f"Bearer {_jwt('acct-1', n)}", "chatgpt-account-id": "acct-1"}
                 for n in ("a", "b")]
    # A refreshed access token is still the same account.
    assert tenant_for(refreshed[0], salt=SALT) == tenant_for(refreshed[1], salt=SALT)
    # Claiming someone else's account in the header does not move you into it.
    spoof = {"authorization": f"Bearer {_jwt('acct-2', 'a')}", "chatgpt-account-id": "acct-1"}
    assert tenant_for(spoof, salt=SALT) != tenant_for(refreshed[0], salt=SALT)


def test_explicit_headers_win_and_fingerprint_skips_harness_boilerplate() -> None:
    headers, body = captured(CODEX_APIKEY[0])
    explicit = identify("responses", {**headers, "x-lore-session-id": "mine",
                                      "x-lore-project": "/srv/app/"}, body, salt=SALT)
    assert (explicit.session, explicit.project) == ("mine", "/srv/app")

    bare = {k: v for k, v in headers.items() if k not in ("session-id", "thread-id")}
    no_key = {k: v for k, v in body.items() if k != "prompt_cache_key"}
    fp = identify("responses", bare, no_key, salt=SALT).session
    assert fp.startswith("fp-")
    # A different first request ("say bye") in the same cwd is another conversation,
    # although both begin with the same <environment_context> item.
    other = json.loads(json.dumps(no_key).replace('"say hi"', '"say bye"'))
    assert identify("responses", bare, other, salt=SALT).session != fp
    # Later turns appended to the same conversation keep the fingerprint.
    longer = {**no_key, "input": [*no_key["input"],
                                  {"role": "assistant", "content": "hi"},
                                  {"role": "user", "content": "and now?"}]}
    assert identify("responses", bare, longer, salt=SALT).session == fp


def test_project_from_system_prompt_line_and_unknown_otherwise() -> None:
    chat = {"messages": [{"role": "system", "content": "Working directory: /work/repo\n"},
                         {"role": "user", "content": "hi"}]}
    assert identify("chat", {}, chat, salt=SALT).project == "/work/repo"
    assert identify("chat", {}, {"messages": [{"role": "user", "content": "hi"}]},
                    salt=SALT).project == "unknown"


def test_salt_is_created_once_owner_only(tmp_path: Path) -> None:
    salt = load_salt(tmp_path)
    assert len(salt) == 32 and load_salt(tmp_path) == salt
    assert stat.S_IMODE((tmp_path / "tenant.salt").stat().st_mode) == 0o600
