"""Sessions as each client defines them (issue 33, item 4): its explicit session
id when it sends one, else a fingerprint of what differs between its
conversations, never of its fixed preamble.

The shapes of clients without captured requests (aider, OpenCode) come from
``testing/client_shapes.py``, which names the source of each.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from lore_gateway.memory.fingerprint import first_user_text
from lore_gateway.memory.identity import PersonalTenancy, identify
from lore_gateway.testing import client_shapes as shapes

FIXTURES = Path(__file__).resolve().parents[3] / "shared" / "fixtures"
PERSONAL = PersonalTenancy()


def session(headers: dict[str, str], body: dict[str, Any], protocol: str = "chat") -> str:
    return identify(protocol, headers, body, tenancy=PERSONAL).session


def captured(name: str) -> tuple[dict[str, str], dict[str, Any]]:
    request = json.loads(next(FIXTURES.glob(f"*/captured-requests/{name}")).read_text())
    return {k.lower(): v for k, v in request["headers"].items()}, request["body"]


# --- explicit ids ---------------------------------------------------------------


def test_opencode_sessions_are_its_x_session_id_and_its_title_call_shares_it() -> None:
    project = "/home/dev/shop"
    first = shapes.opencode_request(project, [{"role": "user", "content": "fix the cart"}])
    other = shapes.opencode_request(project, [{"role": "user", "content": "fix the cart"}])
    a, b = shapes.opencode_headers("ses_aaa111"), shapes.opencode_headers("ses_bbb222")
    # The same opening words in the same directory: two sessions all the same.
    assert session(a, first, "anthropic") == "ses_aaa111"
    assert session(b, other, "anthropic") == "ses_bbb222"
    title = shapes.opencode_title_request("fix the cart")
    ident = identify("anthropic", a, title, tenancy=PERSONAL)
    assert (ident.session, ident.project) == ("ses_aaa111", "unknown")
    assert identify("anthropic", a, first, tenancy=PERSONAL).project == project


@pytest.mark.parametrize(("header", "value"), [
    ("x-opencode-session", "ses_zen"),        # OpenCode on its own provider
    ("x-session-affinity", "ses_affinity"),   # OpenCode, pi-ai
    ("conversation_id", "0199-codex-old"),    # older Codex builds
])
def test_every_client_session_header_is_honoured(header: str, value: str) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}]}
    assert session({header: value}, body) == value
    # Ours wins over the client's.
    assert session({header: value, "x-lore-session-id": "mine"}, body) == "mine"


def test_a_responses_conversation_is_the_session() -> None:
    body = {"input": "hi", "conversation": "conv_123"}
    assert session({}, body, "responses") == "conv_123"
    assert session({}, {**body, "conversation": {"id": "conv_456"}}, "responses") == "conv_456"


def test_codex_and_claude_code_keep_their_sessions_and_fingerprints() -> None:
    """Their explicit ids as before, and the fingerprint without them is the one
    earlier gateways computed (project, first user text), so no stored session
    of theirs splits."""
    headers, body = captured("apikey_custom_provider__turn1_request.json")
    assert session(headers, body, "responses") == headers["session-id"]
    headers, body = captured("messages_turn1_request.json")
    assert session(headers, body, "anthropic") == headers["x-claude-code-session-id"]
    for name, project, first in (
            ("apikey_custom_provider__turn1_request.json", "/home/dev/project", "say hi"),
            ("messages_turn1_request.json", "/home/dev/project", "say hi")):
        _, body = captured(name)
        bare = {k: v for k, v in body.items() if k not in ("prompt_cache_key", "metadata")}
        digest = hashlib.sha256(f"{project}\0{first}".encode()).hexdigest()[:20]
        assert first_user_text(bare) == first
        assert session({}, bare, "x") == f"fp-{digest}"


# --- aider: no session id, a fixed preamble -------------------------------------

AIDER_SHAPES = {
    "examples-as-messages": {},
    "examples-in-system": {"examples_as_sys_msg": True},
    "reminder-in-user-message": {"reminder": "user"},
    "no-system-prompt": {"use_system_prompt": False, "reminder": "user"},
}


@pytest.mark.parametrize("options", AIDER_SHAPES.values(), ids=AIDER_SHAPES.keys())
def test_aider_conversations_are_distinct_sessions_and_one_grows_in_one(
        options: dict[str, Any]) -> None:
    one, two = shapes.AiderChat(**options), shapes.AiderChat(**options)
    first = session({}, one.request("Add a --verbose flag to the CLI."))
    assert first.startswith("fp-")
    assert session({}, two.request("Why does the config loader crash on empty files?")) \
        != first
    # The same conversation, growing: its first message stays the name, while the
    # repository map, the files in the chat and the newest message change.
    one.answered("Add the flag in src/app.py: ...")
    one.files = (*one.files, "src/cli.py")
    assert session({}, one.request("Now document it in the README.")) == first
    one.answered("Done.")
    assert session({}, one.request("Thanks, and run the tests.")) == first
    assert first_user_text(one.request("x")) == "Add a --verbose flag to the CLI."


def test_aider_in_two_repositories_is_two_sessions() -> None:
    body = shapes.AiderChat().request("hi")
    assert identify("chat", {"x-lore-project": "/a"}, body, tenancy=PERSONAL).session != \
        identify("chat", {"x-lore-project": "/b"}, body, tenancy=PERSONAL).session


def test_a_reminder_is_cut_only_where_it_repeats_the_system_prompt() -> None:
    system = "You are a bot.\n\nRule one.\n\nRule two."
    body = {"messages": [{"role": "system", "content": system},
                         {"role": "user", "content": "Question.\n\nDetail.\n\nRule two."}]}
    assert first_user_text(body) == "Question.\n\nDetail."
    body["messages"][1]["content"] = "Question.\n\nDetail."
    assert first_user_text(body) == "Question.\n\nDetail."


def test_a_real_answer_is_no_acknowledgement() -> None:
    """Only a short canned reply, "Ok." or "Ok, …", marks a priming pair."""
    body = {"messages": [
        {"role": "user", "content": "What is a monad?"},
        {"role": "assistant", "content": "Okra is a vegetable; a monad is a ..."},
        {"role": "user", "content": "Thanks."}]}
    assert first_user_text(body) == "What is a monad?"
    for reply in ("Ok, " + "x" * 200, "ok", "OK.", "Okay, sure."):
        body["messages"][1]["content"] = reply
        assert first_user_text(body) == "What is a monad?"
    for reply in ("Ok.", "Ok, I will use these files as references."):
        body["messages"][1]["content"] = reply
        assert first_user_text(body) == "Thanks."
