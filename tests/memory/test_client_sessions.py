"""Sessions as each client defines them (issue 33, item 4): its explicit session
id when it sends one, else a fingerprint of what differs between its
conversations, never of its fixed preamble.

The shapes of clients without captured requests (aider, OpenCode) come from
``testing/client_shapes.py``, which names the source of each; Gemini CLI's is
built below, after a request of 0.61 captured offline.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from lore_gateway.memory.tenancy.fingerprint import first_user_text, has_answer
from lore_gateway.memory.tenancy.identity import PersonalTenancy, identify
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


# --- Gemini CLI: no session id, a <session_context> preamble --------------------
# Gemini CLI 0.61 on an API key sends no session id (its session id goes only to
# Code Assist). Its first user content opens with a <session_context> part (date,
# OS, temp dir, workspace directories, folder tree), then the prompt; the shape
# below is synthetic, after a captured request.


def gemini_context(cwd: str, *extra_dirs: str, date: str = "Saturday, December 5, 2026",
                   tree: bool = True) -> str:
    dirs = "\n".join(f"  - {d}" for d in (cwd, *extra_dirs))
    listing = (f"- **Workspace Directories:**\n{dirs}\n- **Directory Structure:**\n\n"
               f"Showing up to 200 items (files + folders).\n\n{cwd}/\n└───README.md\n"
               if tree else "")
    return (f"<session_context>\nThis is the Gemini CLI. We are setting up the context for"
            f" our chat.\nToday's date is {date} (formatted according to the user's locale)."
            f"\nMy operating system is: linux\nThe project's temporary directory is:"
            f" /home/dev/.gemini/tmp/shop\n{listing}\n\n</session_context>")


def gemini_cli_request(context: str, prompt: str, *later: dict[str, Any],
                       merged: bool = True) -> dict[str, Any]:
    """``contents`` as the CLI sends them: the context part and the prompt in one
    user content (``merged``), or as two user contents."""
    head = ([{"role": "user", "parts": [{"text": context}, {"text": prompt}]}] if merged else
            [{"role": "user", "parts": [{"text": context}]},
             {"role": "user", "parts": [{"text": prompt}]}])
    return {"contents": [*head, *later],
            "systemInstruction": {"role": "user", "parts": [{"text": "You are an agent."}]},
            "tools": [{"functionDeclarations": [{"name": "read_file"}]}],
            "generationConfig": {"temperature": 1}}


def model(*parts: dict[str, Any]) -> dict[str, Any]:
    return {"role": "model", "parts": list(parts)}


def user(*parts: dict[str, Any]) -> dict[str, Any]:
    return {"role": "user", "parts": list(parts)}


def test_gemini_cli_conversations_are_distinct_sessions_and_one_grows_in_one() -> None:
    context = gemini_context("/home/dev/shop")
    first = session({}, gemini_cli_request(context, "fix the cart"), "gemini")
    assert first.startswith("fp-")
    assert session({}, gemini_cli_request(context, "why is checkout slow?"), "gemini") != first
    # Its next requests: a tool call and its response, then the next prompt; the
    # context part alone in its own content; resumed the next day (--resume keeps
    # the saved history, whose context has the old date: the same conversation).
    call = {"functionCall": {"id": "c1", "name": "read_file", "args": {"file_path": "a"}}}
    answer = {"functionResponse": {"id": "c1", "name": "read_file",
                                   "response": {"output": "cart"}}}
    grown = gemini_cli_request(context, "fix the cart", model({"text": "Looking.",
                                                                "thought": True}, call),
                               user(answer), model({"text": "Fixed."}),
                               user({"text": "now add a test"}))
    assert session({}, grown, "gemini") == first
    assert session({}, gemini_cli_request(context, "fix the cart", merged=False),
                   "gemini") == first
    tomorrow = gemini_context("/home/dev/shop", date="Sunday, December 6, 2026")
    assert session({}, gemini_cli_request(tomorrow, "fix the cart"), "gemini") == first
    assert first_user_text(grown) == "fix the cart"
    # The same words in another project are another conversation.
    elsewhere = gemini_cli_request(gemini_context("/home/dev/blog"), "fix the cart")
    assert session({}, elsewhere, "gemini") != first


def test_a_gemini_cli_hook_context_is_not_the_prompt() -> None:
    """A hook's <hook_context> comes after the prompt; alone it names nothing."""
    context = gemini_context("/home/dev/shop")
    hooked = gemini_cli_request(context, "fix the cart")
    hooked["contents"][0]["parts"].append({"text": "<hook_context>branch: main</hook_context>"})
    assert first_user_text(hooked) == "fix the cart"
    only = {"contents": [user({"text": context},
                              {"text": "<hook_context>branch: main</hook_context>"})]}
    assert first_user_text(only) == ""


def test_gemini_cli_project_is_its_first_workspace_directory() -> None:
    def project(body: dict[str, Any], headers: dict[str, str] | None = None) -> str:
        return identify("gemini", headers or {}, body, tenancy=PERSONAL).project

    body = gemini_cli_request(gemini_context("/home/dev/shop/", "/home/dev/lib"), "hi")
    assert project(body) == "/home/dev/shop"
    # ``lore run gemini`` sends the project header, which wins.
    assert project(body, {"x-lore-project": "/srv/app"}) == "/srv/app"
    # Every later request of the conversation still opens with it.
    later = gemini_cli_request(gemini_context("/home/dev/shop"), "hi", model({"text": "Hi."}),
                               user({"text": "bye"}))
    assert project(later) == "/home/dev/shop"
    # Without the directory tree (context.includeDirectoryTree off) the CLI names
    # no directory but its temp folder, which is no project.
    assert project(gemini_cli_request(gemini_context("/x", tree=False), "hi")) == "unknown"
    # Another Gemini client's working-directory line in its system instruction.
    sdk = {"contents": [user({"text": "hi"})],
           "system_instruction": {"parts": [{"text": "Working directory: /work/repo"}]}}
    assert project(sdk) == "/work/repo"


def test_a_gemini_history_with_a_model_turn_has_an_answer() -> None:
    context = gemini_context("/home/dev/shop")
    first = gemini_cli_request(context, "fix the cart")
    assert not has_answer(first["contents"])
    grown = gemini_cli_request(context, "fix the cart", model({"text": "Fixed."}),
                               user({"text": "thanks"}))
    assert has_answer(grown["contents"])
