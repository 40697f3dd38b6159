"""Tenant, project and session from the requests real clients sent (fixtures)."""

from __future__ import annotations

import base64
import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from lore_gateway.errors import GatewayError
from lore_gateway.memory.tenancy.identity import PERSONAL, KeyTenancy, PersonalTenancy, identify

FIXTURES = Path(__file__).resolve().parents[3] / "shared" / "fixtures"
PERSONAL_MODE = PersonalTenancy()


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
    ident = identify("responses", headers, body, tenancy=PERSONAL_MODE)
    assert ident.session == headers["session-id"] == body["prompt_cache_key"]
    assert ident.project == "/home/dev/project"


@pytest.mark.parametrize("name", CLAUDE)
def test_claude_code_session_header_and_primary_working_directory(name: str) -> None:
    headers, body = captured(name)
    ident = identify("anthropic", headers, body, tenancy=PERSONAL_MODE)
    assert ident.session == "db19ad6e-8e38-40d7-8fb5-2cdd1891bc27"
    assert ident.project == "/home/dev/project"


def test_a_turn_and_its_follow_up_share_one_identity() -> None:
    for pair in (CODEX_APIKEY, CODEX_CHATGPT, CLAUDE):
        first, second = (identify("x", *captured(name), tenancy=PERSONAL_MODE) for name in pair)
        assert first == second


def test_zstd_chatgpt_request_and_websocket_attempt() -> None:
    headers, body = captured("chatgpt_login_builtin_provider__zstd_request_decompressed.json")
    ident = identify("codex", headers, body, tenancy=PERSONAL_MODE)
    assert ident.session == "01a22c2c-81b3-7cb2-a04c-492f0b6ba529"
    assert ident.project == "/home/dev/project"
    ws_headers, ws_body = captured("chatgpt_login_builtin_provider__websocket_upgrade_attempt.json")
    ws = identify("codex", ws_headers, ws_body, tenancy=PERSONAL_MODE)
    assert (ws.session, ws.project, ws.tenant) == (ident.session, "unknown", ident.tenant)


ALL_CAPTURED = CODEX_APIKEY + CODEX_CHATGPT + CLAUDE


def test_personal_mode_is_one_tenant_whatever_the_credential() -> None:
    """API keys, ChatGPT logins and Claude keys all land in the one personal memory."""
    tenants = {identify("x", *captured(name), tenancy=PERSONAL_MODE).tenant
               for name in ALL_CAPTURED}
    assert tenants == {PERSONAL}
    assert identify("x", {}, {}, tenancy=PERSONAL_MODE).tenant == PERSONAL


def _jwt(account: str, nonce: str) -> str:
    def part(obj: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).decode().rstrip("=")
    claims = {"iat": nonce, "https://api.openai.com/auth": {"chatgpt_account_id": account}}
    return f"{part({'alg': 'none'})}.{part(claims)}.c2ln"


def test_team_mode_the_gateway_key_decides_never_a_token_claim() -> None:
    team = KeyTenancy({"key-a": "alice", "key-b": "bob"}.get)
    headers, body = captured(CODEX_CHATGPT[0])
    assert identify("codex", {**headers, "x-lore-key": "key-a"}, body, tenancy=team).tenant \
        == "alice"
    # A forged ChatGPT token claiming someone's account selects nothing: the key does.
    forged = {"authorization": f"Bearer {_jwt('acct-of-alice', 'a')}",
              "chatgpt-account-id": "acct-of-alice", "x-lore-key": "key-b"}
    assert identify("codex", forged, body, tenancy=team).tenant == "bob"


@pytest.mark.parametrize(("headers", "says"), [
    ({"authorization": "Bearer sk-real-provider-key"}, "carries no gateway key"),
    ({"x-lore-key": "lore_k_unknown"}, "unknown or revoked"),
])
def test_team_mode_refuses_a_request_without_a_valid_key(headers: dict[str, str],
                                                         says: str) -> None:
    team = KeyTenancy({"key-a": "alice"}.get)
    with pytest.raises(GatewayError) as refused:
        identify("responses", headers, {}, tenancy=team)
    assert refused.value.status == 401
    assert says in refused.value.message and "X-Lore-Key" in refused.value.message


def test_explicit_headers_win_and_fingerprint_skips_harness_boilerplate() -> None:
    headers, body = captured(CODEX_APIKEY[0])
    explicit = identify("responses", {**headers, "x-lore-session-id": "mine",
                                      "x-lore-project": "/srv/app/"}, body, tenancy=PERSONAL_MODE)
    assert (explicit.session, explicit.project) == ("mine", "/srv/app")

    bare = {k: v for k, v in headers.items() if k not in ("session-id", "thread-id")}
    no_key = {k: v for k, v in body.items() if k != "prompt_cache_key"}
    fp = identify("responses", bare, no_key, tenancy=PERSONAL_MODE).session
    assert fp.startswith("fp-")
    # A different first request ("say bye") in the same cwd is another conversation,
    # although both begin with the same <environment_context> item.
    other = json.loads(json.dumps(no_key).replace('"say hi"', '"say bye"'))
    assert identify("responses", bare, other, tenancy=PERSONAL_MODE).session != fp
    # Later turns appended to the same conversation keep the fingerprint.
    longer = {**no_key, "input": [*no_key["input"],
                                  {"role": "assistant", "content": "hi"},
                                  {"role": "user", "content": "and now?"}]}
    assert identify("responses", bare, longer, tenancy=PERSONAL_MODE).session == fp


def test_project_from_system_prompt_line_and_unknown_otherwise() -> None:
    chat = {"messages": [{"role": "system", "content": "Working directory: /work/repo\n"},
                         {"role": "user", "content": "hi"}]}
    assert identify("chat", {}, chat, tenancy=PERSONAL_MODE).project == "/work/repo"
    assert identify("chat", {}, {"messages": [{"role": "user", "content": "hi"}]},
                    tenancy=PERSONAL_MODE).project == "unknown"


def test_project_marker_precedence_over_every_text() -> None:
    """A <cwd> anywhere wins over a "Primary working directory" line, which wins
    over any other working-directory line, whatever the order of the texts they
    are in (the system prompt, instructions, developer and user items)."""
    cwd = "<environment_context><cwd>/from/cwd</cwd></environment_context>"
    primary = "Notes\n - Primary working directory: /from/primary\n"
    other = "Working directory: /from/other\n"
    plain = "nothing to see"
    markers = {"cwd": cwd, "primary": primary, "other": other}
    rank = ("cwd", "primary", "other")
    for texts in itertools.product([cwd, primary, other, plain], repeat=4):
        body = {"instructions": texts[0],
                "input": [{"role": "developer", "content": texts[1]},
                          {"role": "user", "content": [{"type": "input_text", "text": texts[2]}]},
                          {"role": "assistant", "content": other},  # not read
                          {"role": "user", "content": texts[3]}]}
        present = [name for name in rank if markers[name] in texts]
        expected = f"/from/{present[0]}" if present else "unknown"
        assert identify("responses", {}, body, tenancy=PERSONAL_MODE).project == expected, texts
