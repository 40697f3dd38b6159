"""Real Gemini CLI (``gemini -p``) through the gateway, offline (issue 35).

``lore setup gemini`` writes the only thing that points Gemini CLI at the
gateway (``GOOGLE_GEMINI_BASE_URL`` in ``~/.gemini/.env``); two sessions follow
in one project (stored as two sessions of the folder the CLI ran in, though it
sends neither a session id nor a project header: memory/tenancy/fingerprint.py,
memory/tenancy/identity.py), and the second one's model recalls what the first was told
through the hidden recall tool (the fake upstream scripts the ``recall``
functionCall; the CLI never sees it). The CLI streams (``:streamGenerateContent
?alt=sse``). In a third session the model goes on to a tool after its recall,
and the CLI's next request gets the follow-up's exact pair back upstream.
(A ``--resume``d session cannot: the CLI saves its sessions without HTML
comments, the anchor among them; it is still stored in the session it
resumes.) ``lore setup --undo gemini`` gives the user's .env back byte for
byte.
The CLI only streams, so the non-streamed path is driven by the google-genai
SDK's ``generate_content``, the same recall through ``:generateContent``.

Gemini CLI 0.61 reaches nothing outside loopback with the settings in
``SETTINGS`` (usage statistics, auto-update and its notice off, no ripgrep
download) and a trusted folder (``GEMINI_CLI_TRUST_WORKSPACE``); it must sign
in with an API key (``security.auth.selectedType``), the auth the gateway
forwards.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from agent_cli import agent_binary, base_env, run
from typer.testing import CliRunner

from lore_gateway.cli import setup as _setup_cli  # noqa: F401  (attaches the command)
from lore_gateway.cli.main import app
from lore_gateway.testing import FakeUpstream, wait_until_stored

pytestmark = pytest.mark.clients

REPO = Path(__file__).resolve().parents[2]
GEMINI_BIN = REPO / ".tools/node_modules/.bin/gemini"
API_KEY = "AIzaFakeTestKey0123456789abcdefghijklmn"
MODEL = "gemini-fake"
FACT = "The invoicing worker deploys from the persimmon branch."
QUERY = "invoicing worker deploy branch"
USER_ENV = b"# my Gemini settings\nDEBUG_PORT=9229\n"
SETTINGS = {
    "security": {"auth": {"selectedType": "gemini-api-key"}},
    "privacy": {"usageStatisticsEnabled": False},
    "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False},
    "tools": {"useRipgrep": False},
}


def gemini_env(home: Path) -> dict[str, str]:
    """A fresh HOME with the settings above, the user's key, a trusted folder."""
    settings = home / ".gemini" / "settings.json"
    settings.parent.mkdir(parents=True, exist_ok=True)
    settings.write_text(json.dumps(SETTINGS))
    return base_env(home) | {"GEMINI_API_KEY": API_KEY, "GEMINI_CLI_TRUST_WORKSPACE": "true"}


def lore(env: dict[str, str], *args: str) -> str:
    result = CliRunner().invoke(app, list(args), env=env)
    assert result.exit_code == 0, result.output
    return result.output


def answer_text(request_json: dict[str, Any]) -> str:
    return json.dumps(request_json["contents"][-1])


def test_setup_then_two_sessions_recall_across_them_resume_and_undo(
        make_gateway: Any, fake_upstream: FakeUpstream, tmp_path: Path) -> None:
    binary = agent_binary("LORE_TEST_GEMINI_BIN", GEMINI_BIN)
    gw = make_gateway()
    home, work = tmp_path / "home", tmp_path / "work"
    work.mkdir()
    env = gemini_env(home)
    dotenv = home / ".gemini" / ".env"
    dotenv.write_bytes(USER_ENV)
    lore_env = {"HOME": str(home), "LORE_DATA_DIR": str(tmp_path / "lore-setup"),
                "LORE_HOST": "127.0.0.1", "LORE_PORT": gw.url.rsplit(":", 1)[1],
                "LORE_TENANCY": "personal", "LORE_KEY": ""}
    lore(lore_env, "setup", "gemini")

    first = run([str(binary), "-m", MODEL, "-p", f"Remember this: {FACT}"], env, work)
    assert first.returncode == 0, first.stderr[-3000:]
    assert fake_upstream.text in first.stdout
    wait_until_stored(gw, FACT)
    (told,) = fake_upstream.model_requests
    assert told.path == f"/v1beta/models/{MODEL}:streamGenerateContent?alt=sse"
    assert told.headers["x-goog-api-key"] == API_KEY
    fake_upstream.reset()
    fake_upstream.default_scenario = f"recall:{QUERY}"

    second = run([str(binary), "-m", MODEL, "-p",
                  "Which branch does the invoicing worker deploy from?"], env, work)
    assert second.returncode == 0, second.stderr[-3000:]
    assert FACT in second.stdout and "According to memory" in second.stdout, second.stdout
    # The recall call never reached the CLI (it would have answered it with an
    # unknown-tool error in a third request): the gateway sent the follow-up,
    # streamed as the CLI asked, with the recalled fact.
    asked, follow_up = fake_upstream.model_requests
    declared = [d["name"] for t in asked.json["tools"] for d in t.get("functionDeclarations", [])]
    assert "recall" in declared
    assert follow_up.path.endswith(":streamGenerateContent?alt=sse")
    assert FACT in answer_text(follow_up.json) and "functionResponse" in answer_text(
        follow_up.json)
    # Stored in order: the recall call before the answer that used it.
    wait_until_stored(gw, "[tool_call:recall]")
    stored = [m.content for s in gw.memory.sessions(None)
              for m in gw.memory.session_messages(None, s.session)]
    call = next(i for i, m in enumerate(stored) if m.startswith("[tool_call:recall]"))
    assert QUERY in stored[call]
    assert any("According to memory" in m for m in stored[call + 1:]), stored
    # Two runs, two sessions: the CLI sends no session id, so each is named by its
    # prompt (past its <session_context>), and both are in the folder it ran in
    # (its first workspace directory there), with no project header from setup.
    sessions = gw.memory.sessions(None)
    assert len(sessions) == 2, sessions
    assert {s.project for s in sessions} == {str(work.resolve())}
    # A --resume'd run goes on in its session: the saved history keeps its prompt
    # first, behind a new <session_context>.
    fake_upstream.reset()
    resumed = run([str(binary), "-m", MODEL, "--resume", "latest", "-p",
                   "And which branch for staging?"], env, work)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    wait_until_stored(gw, "And which branch for staging?")
    grown = {s.session: s.turns for s in gw.memory.sessions(None)}
    assert grown.keys() == {s.session for s in sessions}
    assert sum(grown.values()) == sum(s.turns for s in sessions) + 1

    # Within one run, the next request after a hidden recall (here the model goes
    # on to read a file) carries the follow-up's exact pair where the CLI's
    # history holds the marker: the stored pair replaces it.
    (work / "notes.txt").write_text("persimmon\n")
    fake_upstream.reset()
    fake_upstream.script([f"recall:{QUERY}", 'tool:read_file {"file_path": "notes.txt"}',
                          "text:Done."])
    third = run([str(binary), "-m", MODEL, "-p", "Check the deploy branch notes."], env, work)
    assert third.returncode == 0, third.stderr[-3000:]
    assert "Done." in third.stdout
    asked, follow_up, after_tool = fake_upstream.model_requests
    pair = follow_up.json["contents"][-2:]
    assert pair[0]["parts"][-1]["functionCall"]["name"] == "recall"
    history = after_tool.json["contents"]
    assert any(history[i:i + 2] == pair for i in range(len(history) - 1)), history
    assert "lore-recall:" not in json.dumps(history)
    assert "functionResponse" in json.dumps(history[-1])  # the file it read

    lore(lore_env, "setup", "--undo", "gemini")
    assert dotenv.read_bytes() == USER_ENV


def test_a_non_streaming_sdk_client_recalls_through_generate_content(
        gateway: Any, fake_upstream: FakeUpstream) -> None:
    from google import genai
    from google.genai import types

    client = genai.Client(api_key=API_KEY, http_options=types.HttpOptions(
        base_url=gateway.url, retry_options=None))
    tools = [types.Tool(function_declarations=[types.FunctionDeclaration(
        name="read_file", description="Read a file",
        parameters_json_schema={"type": "object", "properties": {"path": {"type": "string"}}})])]
    config = types.GenerateContentConfig(
        tools=tools, automatic_function_calling=types.AutomaticFunctionCallingConfig(
            disable=True))
    client.models.generate_content(model=MODEL, contents=f"Remember this: {FACT}",
                                   config=config)
    wait_until_stored(gateway, FACT)
    fake_upstream.reset()
    fake_upstream.default_scenario = f"recall:{QUERY}"
    answer = client.models.generate_content(
        model=MODEL, contents="Which branch does the invoicing worker deploy from?",
        config=config)
    assert answer.function_calls is None
    assert FACT in (answer.text or "") and "According to memory" in (answer.text or "")
    asked, follow_up = fake_upstream.model_requests
    assert [r.route.rsplit(":", 1)[1] for r in (asked, follow_up)] == ["generateContent"] * 2
    assert FACT in answer_text(follow_up.json)
