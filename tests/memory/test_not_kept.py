"""Not kept, on request (issue 36): ``x-lore-no-store``, amnesia and ``<private>``
through a running gateway, the fake provider playing the agent's model and the
worker model. Each test looks at every table (the search indexes' own storage
included), what a search finds, the worker's requests and the log records, and
at what the provider received."""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from privacy_kit import COUNTS_ONLY, changed, holding, index_terms, search_hits, tables
from typer.testing import CliRunner

from lore_gateway.cli.main import _register, app
from lore_gateway.knowledge import export as ex
from lore_gateway.knowledge import store as kstore
from lore_gateway.knowledge.block import BLOCK_HEADING
from lore_gateway.memory.store.records import Identity, TurnRecord
from lore_gateway.memory.tenancy.identity import PERSONAL
from lore_gateway.protocols.common import Message
from lore_gateway.testing import ANTHROPIC_KEY, FakeUpstream, wait_until
from lore_gateway.testing.waiting import wait_until_stored

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "knowledge"))
from kit import SYSTEM, TOOLS_ANTHROPIC, AnthropicSession, agent_requests, git_project, post

# The worker distills after every turn; nothing waits for an idle session.
FAST = {"worker": True, "distill_segment_tokens": 1, "distill_idle_s": 3600,
        "worker_retry_base_s": 0.05}
FACT = "The heron relay listens on port 4817 behind the staging proxy."
QUERY = "heron relay port"
# Each is one search-index term (letters and digits, no stem to strip), so a
# look at the indexes' terms finds it if any row still holds it.
UNKEPT = "qxvorbitzel"
SECRET = "zq7xkcdvault"


def store_fact(gw: Any, project: Path) -> None:
    """A stored turn for recall to find (written directly: no worker job follows)."""
    assert gw.memory.submit_turn(TurnRecord(
        Identity(PERSONAL, str(project), "earlier"), "anthropic", "claude-fake",
        (Message("user", FACT), Message("assistant", "Noted.")), time.time()))
    gw.memory.flush(timeout=20)


def distilled_by_worker(gw: Any, fake: FakeUpstream, session: AnthropicSession,
                        text: str) -> list[Any]:
    """A kept turn, and the worker's distill request that follows it: proof that
    the worker runs (its requests are what the tests read)."""
    session.say(text)
    wait_until(lambda: any(text in r.body.decode() for r in worker_requests(fake)),
               "the worker's distill request for the kept turn")
    return worker_requests(fake)


def reply(session: AnthropicSession) -> str:
    """The text of the session's last answer, as the client read it."""
    return str(session.messages[-1]["content"][0]["text"])


def worker_requests(fake: FakeUpstream) -> list[Any]:
    return [r for r in fake.model_requests if "x-lore-worker" in r.headers]


def cli(gw: Any, monkeypatch: pytest.MonkeyPatch, *args: str) -> Any:
    _register()
    for name, value in (("LORE_DATA_DIR", str(gw.settings.data_dir)), ("LORE_HOST", "127.0.0.1"),
                        ("LORE_PORT", str(gw.port)), ("LORE_EMBEDDINGS", "false")):
        monkeypatch.setenv(name, value)
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result.output


def test_x_lore_no_store_keeps_nothing_and_recall_still_answers(
        make_gateway: Any, fake_upstream: FakeUpstream, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    gw = make_gateway(**FAST)
    project = git_project(tmp_path / "repo")
    store_fact(gw, project)
    gw.memory.write_job(lambda c: kstore.upsert(
        c, tenant=PERSONAL, project=str(project), category="decision", title="Relay port",
        content="The heron relay listens on port 4817."))
    before = tables(gw)

    asking = AnthropicSession(gw, project, "not-kept")
    asking.say(f"Which port does the heron relay use? Also note {UNKEPT} for later.",
               headers={"x-lore-no-store": "1", "x-fake-scenario": f"recall:{QUERY}"})
    # Recall answered from memory: reading it is fine.
    assert "According to memory" in reply(asking) and "4817" in reply(asking)
    after = tables(gw)
    assert changed(before, after) <= COUNTS_ONLY, changed(before, after)
    assert holding(after, UNKEPT) == {}
    assert index_terms(gw.memory, UNKEPT[:6]) == [] and search_hits(gw.memory, UNKEPT) == []
    # Knowledge was read (the block went upstream), but no block row, no .lore.md.
    sent = agent_requests(fake_upstream)
    assert len(sent) == 2, "the recall follow-up"
    assert BLOCK_HEADING in json.dumps(sent[0].json["system"])
    assert not (project / ex.FILE_NAME).exists()
    for request in sent:  # x-lore-* headers never go upstream
        assert not any(name.startswith("x-lore") for name in request.headers)

    # The worker is running: a kept turn in another session is distilled, and
    # nothing of the request that was not kept reaches it.
    workers = distilled_by_worker(gw, fake_upstream, AnthropicSession(gw, project, "kept"),
                                  "Rename the heron module to egret.")
    assert all(UNKEPT not in w.body.decode() for w in workers)
    assert UNKEPT not in caplog.text and "turn not kept: x-lore-no-store" in caplog.text


def test_amnesia_for_a_session_keeps_it_out_until_switched_off(
        make_gateway: Any, fake_upstream: FakeUpstream, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    gw = make_gateway(**FAST)
    project = git_project(tmp_path / "repo")
    store_fact(gw, project)
    switch = gw.amnesia

    out = cli(gw, monkeypatch, "amnesia", "on", "--session", "quiet")
    assert "Amnesia on for session quiet" in out
    wait_until(lambda: switch.active(PERSONAL, "quiet"), "the gateway to see the switch")
    status = cli(gw, monkeypatch, "status")
    assert "amnesia" in status and "session quiet" in status
    assert json.loads(cli(gw, monkeypatch, "status", "--json"))["amnesia"]["on"] is True

    before = tables(gw)
    quiet = AnthropicSession(gw, project, "quiet")
    quiet.say(f"First: the {UNKEPT} flag stays off.")
    quiet.say("What port is the heron relay on?", headers={"x-fake-scenario": f"recall:{QUERY}"})
    assert "According to memory" in reply(quiet) and "4817" in reply(quiet)
    after = tables(gw)
    assert changed(before, after) <= COUNTS_ONLY, changed(before, after)
    assert holding(after, UNKEPT) == {} and index_terms(gw.memory, UNKEPT[:6]) == []
    assert search_hits(gw.memory, UNKEPT) == []

    # Another session is kept and distilled; the quiet one reaches no worker request.
    workers = distilled_by_worker(gw, fake_upstream, AnthropicSession(gw, project, "loud"),
                                  "Rename the heron module to egret.")
    assert all(UNKEPT not in w.body.decode() for w in workers)
    assert UNKEPT not in caplog.text and "turn not kept: amnesia (session)" in caplog.text

    out = cli(gw, monkeypatch, "amnesia", "off", "--session", "quiet")
    assert "Amnesia off for session quiet" in out
    wait_until(lambda: not switch.active(PERSONAL, "quiet"), "the gateway to see it off")
    assert "amnesia\toff" in cli(gw, monkeypatch, "status") or "Amnesia is off" in cli(
        gw, monkeypatch, "amnesia", "status")
    quiet.say("From now on this is stored: the kingfisher build.")
    wait_until_stored(gw, "kingfisher")
    stored = [m.content for m in gw.memory.session_messages(PERSONAL, "quiet")]
    assert any("kingfisher" in text for text in stored)
    assert not any(UNKEPT in text for text in stored)


def test_private_spans_go_upstream_unchanged_and_are_kept_as_placeholders(
        make_gateway: Any, fake_upstream: FakeUpstream, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    """Recall off, so the gateway changes nothing of the request: the provider must
    get the client's exact bytes. The answer quotes the secret; it is redacted too."""
    caplog.set_level(logging.DEBUG)
    gw = make_gateway(recall=False, **FAST)
    project = git_project(tmp_path / "repo")
    text = (f"Deploy with the token <private>{SECRET} and pin 9917</private> to staging, "
            "then run the smoke tests.")
    body = {"model": "claude-fake", "max_tokens": 256, "stream": True,
            "system": SYSTEM + f"\nPrimary working directory: {project}",
            "tools": TOOLS_ANTHROPIC,
            "messages": [{"role": "user", "content": [{"type": "text", "text": text}]}]}
    sent = orjson.dumps(body)
    raw = post(gw.url + "/v1/messages", body, {
        "x-api-key": ANTHROPIC_KEY, "anthropic-version": "2023-06-01",
        "x-lore-session-id": "private-spans",
        "x-fake-scenario": f"text:Deploying with {SECRET} and pin 9917 now, as asked."})
    (upstream,) = agent_requests(fake_upstream)
    assert upstream.body == sent  # byte for byte
    assert SECRET.encode() in raw  # the client's answer is the provider's

    wait_until(lambda: any("[private]" in r.body.decode() for r in worker_requests(
        fake_upstream)), "the worker's distill request")
    stored = [m.content for m in gw.memory.session_messages(PERSONAL, "private-spans")]
    assert stored[0] == "Deploy with the token [private] to staging, then run the smoke tests."
    assert stored[1].startswith("Deploying with [private] now")
    snapshot = tables(gw)
    assert holding(snapshot, SECRET) == {} and holding(snapshot, "9917") == {}
    assert holding(snapshot, "[private]")  # what is kept instead
    assert index_terms(gw.memory, SECRET[:6]) == [] and search_hits(gw.memory, SECRET) == []
    assert all(SECRET not in r.body.decode() and "9917" not in r.body.decode()
               for r in worker_requests(fake_upstream))
    assert SECRET not in caplog.text and "9917" not in caplog.text


def test_the_context_managers_stored_state_holds_private_text_as_a_placeholder(
        make_gateway: Any, fake_upstream: FakeUpstream, tmp_path: Path) -> None:
    """A long turn whose request holds a private span: context management cuts inside
    it and repeats the request in the rewritten prefix. Upstream gets the user's exact
    words (the state in memory); the state stored in ``context_sessions`` has
    ``[private]``, as has every other table."""
    fake_upstream.metered = True
    gw = make_gateway(context_window=12_000, worker=True, distill_segment_tokens=400,
                      distill_idle_s=3600, worker_retry_base_s=0.05)
    headers = {"x-api-key": ANTHROPIC_KEY, "anthropic-version": "2023-06-01",
               "x-lore-session-id": "private-long", "x-lore-project": str(tmp_path)}
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "Remember: the staging deploy port is 8417."},
        {"role": "assistant", "content": "Noted."},
        {"role": "user", "content": f"Find every handler; the API token is <private>{SECRET}"
                                    "</private>, never print it."}]

    def send() -> None:
        body = {"model": "claude-test", "max_tokens": 256, "stream": True, "system": SYSTEM,
                "tools": TOOLS_ANTHROPIC, "messages": messages}
        post(gw.url + "/v1/messages", body, headers)

    def stored_state() -> str | None:
        row = gw.memory.read(lambda c: c.execute(
            "SELECT state FROM context_sessions WHERE session = 'private-long'").fetchone())
        return str(row[0]) if row else None

    send()
    for i in range(70):
        messages.append({"role": "assistant", "content": [
            {"type": "tool_use", "id": f"toolu_{i:04d}", "name": "read_file",
             "input": {"path": f"src/handlers_{i}.py"}}]})
        messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": f"toolu_{i:04d}",
             "content": "".join(f"def handler_{i}_{j}(request): ...\n" for j in range(40))}]})
        send()
        state = stored_state()
        if state is not None and orjson.loads(state)["request"]:
            break
    assert state is not None, "no context state was stored"
    assert orjson.loads(state)["request"].endswith(
        "the API token is [private], never print it.")
    # Upstream: a rewritten history (the first message is the gateway's prefix),
    # repeating the request as the user wrote it.
    last = agent_requests(fake_upstream)[-1].json["messages"]
    assert "[lore-gateway: session history]" in orjson.dumps(last[0]).decode()
    assert f"the API token is <private>{SECRET}</private>" in orjson.dumps(last[:3]).decode()
    assert holding(tables(gw), SECRET) == {}
