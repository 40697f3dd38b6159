"""Distillation and knowledge through a running gateway, the fake provider
playing both the agent's model and the worker model (issue 12 acceptance)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
from typer.testing import CliRunner

from lore_gateway.distill import prompts
from lore_gateway.distill import store as dstore
from lore_gateway.knowledge import export as ex
from lore_gateway.knowledge import store as kstore
from lore_gateway.knowledge.block import BLOCK_HEADING, UPDATE_HEADING
from lore_gateway.testing import ANTHROPIC_KEY, FakeUpstream, wait_until
from lore_gateway.worker import jobs

sys.path.insert(0, str(Path(__file__).resolve().parent))
import itertools

from kit import (
    ANSWER,
    AnthropicSession,
    ResponsesSession,
    agent_requests,
    git_project,
    read,
    worker_requests,
)

DECISION = "Decision: deploy from the tangerine branch. Main stays frozen until the 4.2 release."
FAST = {"worker": True, "distill_segment_tokens": 1, "distill_idle_s": 3600,
        "worker_retry_base_s": 0.05}


def entries(gw: Any) -> list[kstore.Entry]:
    return list(read(gw, lambda c: kstore.entries(c, None, None)))


def distillations(gw: Any) -> list[dstore.Distillation]:
    return list(read(gw, lambda c: dstore.for_scope(c, None)))


def cli(data_dir: Path, monkeypatch: pytest.MonkeyPatch, *args: str) -> Any:
    from lore_gateway.cli.main import _register, app

    _register()
    monkeypatch.setenv("LORE_DATA_DIR", str(data_dir))
    monkeypatch.setenv("LORE_EMBEDDINGS", "false")
    return CliRunner().invoke(app, list(args))


def test_a_session_is_distilled_curated_exported_and_given_to_the_next_session(
        make_gateway: Any, fake_upstream: FakeUpstream, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    project = git_project(tmp_path / "repo")
    (project / "CLAUDE.md").write_text("# House rules\n\nBe brief.\n")
    gw = make_gateway(**FAST)
    first = AnthropicSession(gw, project, "session-one")
    first.say(DECISION)
    wait_until(lambda: entries(gw), "the curator's entry")
    first.say("Now run the tests please.")
    wait_until(lambda: len(worker_requests(fake_upstream, "distill")) >= 2, "a second distill")

    # Worker requests: only after the agent's response was sent, with the
    # session's own credential and the x-lore-worker header, to the same route.
    agents = agent_requests(fake_upstream)
    workers = worker_requests(fake_upstream)
    assert {r.headers["x-lore-worker"] for r in workers} == {"distill", "curate"}
    for worker in workers:
        assert worker.headers["x-api-key"] == ANTHROPIC_KEY
        assert worker.route == "/v1/messages"
        assert worker.json["model"] == "claude-haiku-4-5"
        before = [a for a in agents if a.received_at < worker.received_at]
        assert before and all(a.finished_at is not None and a.finished_at < worker.received_at
                              for a in before)
    assert workers[0].received_at > agents[0].finished_at  # type: ignore[operator]

    # A distillation with its source ids, searchable as an observations message.
    logs = distillations(gw)
    assert logs and logs[0].method == "worker" and logs[0].source_ids
    assert "🔴" in logs[0].text and "tangerine branch" in logs[0].text
    messages = read(gw, lambda c: c.execute(
        "SELECT content FROM messages WHERE role = 'observations'").fetchall())
    assert any(f"t:{logs[0].source_ids[0]}" in m[0] for m in messages)

    # The curator's entry, through the CLI.
    result = cli(gw.settings.data_dir, monkeypatch, "knowledge", "list", "--json")
    assert result.exit_code == 0, result.output
    listed = json.loads(result.output)
    (entry,) = [e for e in listed if e["category"] == "decision"]
    assert entry["title"] == "deploy from the tangerine branch"
    assert entry["project"] == str(project)

    # .lore.md and the pointer section, everything else in CLAUDE.md kept.
    gw.background.knowledge.export_now(entry["tenant"], str(project), "CLAUDE.md")
    lore_md = (project / ".lore.md").read_text()
    assert f"<!-- lore:{entry['id']} -->" in lore_md and "tangerine branch" in lore_md
    claude_md = (project / "CLAUDE.md").read_text()
    assert claude_md.startswith("# House rules\n\nBe brief.\n")
    assert ex.POINTER_BEGIN in claude_md and ".lore.md" in claude_md

    # A person edits the entry; the next session imports it and sees it.
    (project / ".lore.md").write_text(lore_md.replace("tangerine", "mandarin"))
    fake_upstream.reset()
    second = AnthropicSession(gw, project, "session-two")
    second.say("What branch do we deploy from?")
    (opening,) = agent_requests(fake_upstream)
    block = opening.json["system"]
    assert isinstance(block, str) and BLOCK_HEADING in block and "mandarin branch" in block
    assert block.startswith(second.system)
    assert [e.content for e in entries(gw)
            if e.category == "decision"] == [entry["content"].replace("tangerine", "mandarin")]


def test_later_requests_extend_the_first_and_a_mid_session_update_is_appended_once(
        make_gateway: Any, fake_upstream: FakeUpstream, tmp_path: Path) -> None:
    project = git_project(tmp_path / "repo")
    gw = make_gateway(**FAST)
    setup = AnthropicSession(gw, project, "earlier")
    setup.say("Decision: use uv for every Python command. pip is not allowed here.")
    wait_until(lambda: entries(gw), "the first entry")
    fake_upstream.reset()

    session = AnthropicSession(gw, project, "later")
    session.say("Hello again.")
    session.say("Decision: the API listens on port 8443. Port 8080 is taken by the proxy.")
    wait_until(lambda: len(entries(gw)) == 2, "the mid-session entry")
    knowledge = gw.background.knowledge
    tenant = entries(gw)[0].tenant
    wait_until(lambda: knowledge.version(tenant, str(project)) == 2, "the curator's notice")
    session.say("Thanks, go on.")
    session.say("And now?")
    sent = [r.json for r in agent_requests(fake_upstream)]
    assert len(sent) == 4
    assert all(s["system"] == sent[0]["system"] for s in sent)
    assert "use uv for every Python command" in sent[0]["system"]
    for earlier, later in itertools.pairwise(sent):
        prefix = later["messages"][:len(earlier["messages"])]
        assert orjson.dumps(prefix) == orjson.dumps(earlier["messages"])
    updates = [m for m in sent[-1]["messages"]
               if UPDATE_HEADING in json.dumps(m.get("content"))]
    assert len(updates) == 1 and "port 8443" in json.dumps(updates[0]), json.dumps(
        [[m["role"] for m in x["messages"]] for x in sent]) + repr(entries(gw))
    # Where it went: before the newest user message of the request that got it.
    third = sent[2]["messages"]
    assert third[-3] == updates[0] and third[-2]["role"] == "assistant"
    assert third[-1]["content"][0]["text"] == "Thanks, go on."


def test_with_the_worker_off_nothing_is_sent_and_the_extractive_distiller_runs(
        make_gateway: Any, fake_upstream: FakeUpstream, tmp_path: Path) -> None:
    project = git_project(tmp_path / "repo")
    gw = make_gateway(**(FAST | {"worker": False}))
    session = AnthropicSession(gw, project, "offline")
    session.say(DECISION)
    session.say("Run `pytest -q tests/test_deploy.py` and fix src/deploy.py.")
    def all_distilled() -> list[dstore.Distillation]:
        stored, rest = read(gw, lambda c: c.execute(
            "SELECT count(*), count(*) FILTER (WHERE id > coalesce((SELECT max(last_source)"
            " FROM distillations), 0)) FROM messages WHERE role != 'observations'").fetchone())
        return distillations(gw) if stored == 4 and rest == 0 else []

    logs = wait_until(all_distilled, "extractive distillations of both turns")
    assert {d.method for d in logs} == {"extractive"}
    text = "\n".join(d.text for d in logs)
    assert "* 🔴" in text and "tangerine branch" in text and "src/deploy.py" in text
    assert worker_requests(fake_upstream) == []


def test_the_daily_budget_stops_worker_requests_until_the_next_day(
        make_gateway: Any, fake_upstream: FakeUpstream, tmp_path: Path) -> None:
    project = git_project(tmp_path / "repo")
    gw = make_gateway(worker_daily_tokens=50_000, **FAST)
    worker = gw.background.worker
    now = 1_800_000_000.0
    worker.clock = lambda: now
    session = AnthropicSession(gw, project, "thrifty")
    session.say("hello")
    tenant = wait_until(lambda: distillations(gw), "the first distillation")[0].tenant
    # The first turn's jobs (its curation too) finish before the budget is spent.
    wait_until(lambda: gw.memory.read(jobs.counts)["queued"] == 0, "the first turn's jobs")
    gw.memory.write_job(lambda c: jobs.charge(c, tenant, now, 49_000, 1_000))
    fake_upstream.reset()
    session.say(DECISION)
    wait_until(lambda: len(distillations(gw)) >= 2, "a distillation without the worker")
    assert distillations(gw)[-1].method == "extractive"
    assert worker_requests(fake_upstream) == []

    tomorrow = jobs.next_day(now) + 1
    worker.clock = lambda: tomorrow
    session.say("A new day.")
    wait_until(lambda: distillations(gw)[-1].method == "worker", "a worker distillation")
    assert len(worker_requests(fake_upstream, "distill")) == 1


@pytest.mark.parametrize("scenario", ["slow:60", "status-500"])
def test_a_failing_or_hung_worker_never_touches_the_agent(
        make_gateway: Any, fake_upstream: FakeUpstream, tmp_path: Path, scenario: str) -> None:
    project = git_project(tmp_path / "repo")
    gw = make_gateway(worker_max_attempts=1, **FAST)
    fake_upstream.worker_scenario = scenario
    session = AnthropicSession(gw, project, "brave")
    session.say(DECISION)
    stuck = wait_until(lambda: worker_requests(fake_upstream), "a worker request")[0]
    answer = session.say("Carry on.")
    if scenario.startswith("slow"):
        # The worker request is still waiting for its answer, and no log exists yet.
        assert not stuck.client_gone.is_set() and distillations(gw) == []
    assert answer.count(b"event: message_stop") == 1
    assert session.messages[-1]["content"][0]["text"] == ANSWER.strip()
    if scenario == "status-500":
        logs = wait_until(lambda: distillations(gw), "the extractive fallback")
        assert logs[0].method == "extractive"


def test_side_channel_requests_get_no_knowledge_and_start_no_jobs(
        make_gateway: Any, fake_upstream: FakeUpstream, tmp_path: Path) -> None:
    project = git_project(tmp_path / "repo")
    gw = make_gateway(**FAST)
    from lore_gateway.memory.tenancy.identity import PERSONAL

    tenant = PERSONAL
    gw.memory.write_job(lambda c: kstore.upsert(
        c, tenant=tenant, project=str(project), category="decision", title="deploy branch",
        content="tangerine"))
    from kit import post

    title = {"model": "claude-fake", "max_tokens": 64, "stream": False,
             "system": "Generate a short title for this conversation.",
             "messages": [{"role": "user", "content": f"fix the bug. Working directory: "
                                                      f"{project}"}]}
    post(gw.url + "/v1/messages", title, {"x-api-key": ANTHROPIC_KEY,
                                          "anthropic-version": "2023-06-01",
                                          "x-lore-session-id": "side"})
    (sent,) = fake_upstream.model_requests
    assert sent.json == title
    assert read(gw, lambda c: c.execute("SELECT count(*) FROM worker_jobs").fetchone()[0]) == 0
    assert worker_requests(fake_upstream) == []
    # Stored as usual, but never part of a segment.
    stored = wait_until(lambda: gw.memory.session_messages(None, "side"), "the stored turn")
    assert [m.role for m in stored] == ["user", "assistant"]
    assert read(gw, lambda c: dstore.next_segment(c, tenant, "side")) == []


def test_responses_sessions_get_the_block_as_a_developer_item(
        make_gateway: Any, fake_upstream: FakeUpstream, tmp_path: Path) -> None:
    project = git_project(tmp_path / "repo")
    gw = make_gateway(**FAST)
    first = ResponsesSession(gw, project, "codex-one")
    first.say(DECISION)
    wait_until(lambda: entries(gw), "the entry")
    workers = worker_requests(fake_upstream)
    assert all(w.route == "/v1/responses" and w.json["model"] == "gpt-5-mini" for w in workers)
    agents_md = project / "AGENTS.md"
    wait_until(lambda: agents_md.exists() and (project / ".lore.md").exists(), "the export")
    assert agents_md.read_text().count(ex.POINTER_BEGIN) == 1
    fake_upstream.reset()
    ResponsesSession(gw, project, "codex-two").say("Which branch?")
    (opening,) = agent_requests(fake_upstream)
    items = opening.json["input"]
    assert items[0]["role"] == "developer" and items[1]["role"] == "developer"
    assert BLOCK_HEADING in items[1]["content"][0]["text"]
    assert "tangerine branch" in items[1]["content"][0]["text"]


@pytest.mark.usefixtures("database_url")
def test_a_queued_job_survives_a_restart_and_runs_with_the_next_credential(
        fake_upstream: FakeUpstream, tmp_path: Path) -> None:
    from lore_gateway.server import Gateway
    from lore_gateway.testing import BackgroundServer, gateway_settings

    project = git_project(tmp_path / "repo")
    settings = gateway_settings(fake_upstream, tmp_path / "data", **FAST)
    fake_upstream.worker_scenario = "slow:60"
    with BackgroundServer(Gateway(settings)) as gw:
        session = AnthropicSession(gw, project, "durable")
        session.say(DECISION)
        wait_until(lambda: worker_requests(fake_upstream, "distill"), "the hung worker request")
    # The gateway stopped mid-job: the job is still queued in the database.
    jobs_left = read_db(settings.data_dir, "SELECT kind, state FROM worker_jobs")
    assert ("distill", "queued") in jobs_left

    fake_upstream.reset()
    with BackgroundServer(Gateway(settings)) as again:
        session.gw = again
        session.say("Carry on.")
        logs = wait_until(lambda: [d for d in distillations(again) if d.method == "worker"],
                          "the restarted job's distillation")
        assert "tangerine branch" in "\n".join(d.text for d in logs)
        assert all(r.headers["x-api-key"] == ANTHROPIC_KEY
                   for r in worker_requests(fake_upstream))


def read_db(data_dir: Path, sql: str) -> list[tuple[Any, ...]]:
    from lore_gateway.config import Settings
    from lore_gateway.storage import db

    conn = db.connect(Settings(data_dir=data_dir).database, readonly=True)
    try:
        return [tuple(r) for r in conn.execute(sql).fetchall()]
    finally:
        conn.close()


def test_distillations_are_found_by_recall_shown_by_data_show_and_counted_in_metrics(
        make_gateway: Any, fake_upstream: FakeUpstream, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    project = git_project(tmp_path / "repo")
    gw = make_gateway(**FAST)
    session = AnthropicSession(gw, project, "findable")
    session.say(DECISION)
    (log,) = wait_until(lambda: distillations(gw), "the distillation")
    from lore_gateway.memory.store.records import Identity

    found = gw.memory.search_sync("tangerine branch frozen", identity=Identity(
        log.tenant, log.project, log.session), scope="session", limit=10)
    roles = [hit.role for hit in found.hits]
    assert "observations" in roles
    result = cli(gw.settings.data_dir, monkeypatch, "data", "show", "findable")
    assert result.exit_code == 0, result.output
    assert "observations" in result.output and "Sources: t:" in result.output
    metrics = urllib_get(gw.url + "/metrics")
    assert 'lore_worker_requests_total{kind="distill",result="ok"}' in metrics
    assert 'lore_distillations_total{generation="0",method="worker"}' in metrics
    assert "lore_knowledge_injections_total" in metrics
    status = gw.background.worker.status()
    assert status["enabled"] is True and status["jobs"]["done"] >= 1
    assert status["today"][log.tenant]["budget_left"] < gw.settings.worker_daily_tokens


def urllib_get(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url, timeout=10) as resp:
        return str(resp.read().decode())


def test_an_idle_session_is_distilled_without_reaching_the_threshold(
        make_gateway: Any, fake_upstream: FakeUpstream, tmp_path: Path) -> None:
    project = git_project(tmp_path / "repo")
    gw = make_gateway(**(FAST | {"distill_segment_tokens": 1 << 30, "distill_idle_s": 0.3}))
    session = AnthropicSession(gw, project, "resting")
    session.say(DECISION)
    (log,) = wait_until(lambda: distillations(gw), "the idle distillation")
    assert "tangerine branch" in log.text and log.method == "worker"


def test_many_logs_are_consolidated_by_the_worker_into_one(
        make_gateway: Any, fake_upstream: FakeUpstream, tmp_path: Path) -> None:
    project = git_project(tmp_path / "repo")
    gw = make_gateway(**(FAST | {"distill_consolidate_after": 2}))
    session = AnthropicSession(gw, project, "chatty")
    for n, text in enumerate([DECISION, "Look at src/billing.py next.", "Then run the tests."]):
        session.say(text)
        wait_until(lambda n=n: len(worker_requests(fake_upstream, "distill")) > n, "a distill")

    def merged() -> list[dstore.Distillation]:
        return [d for d in distillations(gw) if d.generation == 1]

    (top,) = wait_until(merged, "the consolidated log")
    assert top.method == "worker" and distillations(gw) == [top]
    assert worker_requests(fake_upstream, "consolidate")
    for needle in ("tangerine branch", "src/billing.py", "Then run the tests."):
        assert needle in top.text
    assert len(top.source_ids) == 6


def test_sessions_without_a_known_project_get_distilled_but_learn_no_knowledge(
        make_gateway: Any, fake_upstream: FakeUpstream, tmp_path: Path) -> None:
    gw = make_gateway(**FAST)
    session = AnthropicSession(gw, tmp_path, "nowhere")
    session.system = session.system.rsplit("\nPrimary working directory:", 1)[0]
    session.say(DECISION)
    (log,) = wait_until(lambda: distillations(gw), "the distillation")
    assert log.project == "unknown"
    assert worker_requests(fake_upstream, "curate") == []
    assert read(gw, lambda c: c.execute("SELECT count(*) FROM worker_jobs WHERE kind ="
                                        " 'curate'").fetchone()[0]) == 0


def test_a_backend_that_refuses_the_cheaper_model_gets_the_sessions_own(
        make_gateway: Any, fake_upstream: FakeUpstream, tmp_path: Path) -> None:
    project = git_project(tmp_path / "repo")
    gw = make_gateway(**FAST)
    fake_upstream.unknown_models.add("gpt-5-mini")
    session = ResponsesSession(gw, project, "picky")
    session.say(DECISION)
    wait_until(lambda: entries(gw), "the entry")
    models = [r.json["model"] for r in worker_requests(fake_upstream)]
    assert models[:2] == ["gpt-5-mini", "gpt-fake"] and set(models[2:]) == {"gpt-fake"}


def test_a_session_first_seen_midway_gets_an_update_not_a_new_prefix(
        make_gateway: Any, fake_upstream: FakeUpstream, tmp_path: Path) -> None:
    from lore_gateway.memory.tenancy.identity import PERSONAL

    project = git_project(tmp_path / "repo")
    gw = make_gateway(**FAST)
    tenant = PERSONAL
    gw.memory.write_job(lambda c: kstore.upsert(
        c, tenant=tenant, project=str(project), category="decision",
        title="deploy from the tangerine branch", content="Main stays frozen."))
    session = AnthropicSession(gw, project, "midway")
    # History from before the gateway knew this session (an upgrade, a restart
    # with its state deleted): the cached prefix must not change.
    session.messages = [{"role": "user", "content": [{"type": "text", "text": "earlier"}]},
                        {"role": "assistant", "content": [{"type": "text", "text": "ok"}]}]
    session.say("Go on.")
    session.say("And then?")
    first, second = (r.json for r in agent_requests(fake_upstream))
    assert first["system"] == second["system"] == session.system
    assert first["messages"][:2] == session.messages[:2]
    update = first["messages"][2]
    assert UPDATE_HEADING in update["content"][0]["text"] and "tangerine" in json.dumps(update)
    assert first["messages"][3]["role"] == "assistant"
    assert second["messages"][:len(first["messages"])] == first["messages"]


def test_a_contradiction_resolved_mid_session_reaches_the_session_as_an_update(
        make_gateway: Any, fake_upstream: FakeUpstream, tmp_path: Path) -> None:
    project = git_project(tmp_path / "repo")
    gw = make_gateway(**FAST)
    AnthropicSession(gw, project, "before").say(DECISION)
    (old,) = wait_until(lambda: entries(gw), "the first entry")
    fake_upstream.reset()
    session = AnthropicSession(gw, project, "after")
    session.say("Decision: deploy from the mandarin branch. Tangerine is retired.")
    knowledge = gw.background.knowledge
    wait_until(lambda: knowledge.version(old.tenant, str(project)) == 2, "the curator's update")
    session.say("Which branch now?")
    first, second = (r.json for r in agent_requests(fake_upstream))
    assert "tangerine branch" in first["system"]  # frozen: the block does not change
    assert second["system"] == first["system"]
    (entry,) = entries(gw)
    assert entry.id == old.id and "mandarin" in entry.content
    update = second["messages"][-3]
    assert UPDATE_HEADING in update["content"][0]["text"] and "mandarin" in json.dumps(update)


def test_worker_logs_keep_their_budget_and_shape_and_consolidation_keeps_findings(
        make_gateway: Any, fake_upstream: FakeUpstream, tmp_path: Path) -> None:
    """The LLM path (issue 32): each request asks for the budget the extractive
    path would use, an answer cut at it still stores a well-formed log within it,
    and the merge keeps the user's statements and findings over minor lines."""
    from lore_gateway.distill import format as fmt

    project = git_project(tmp_path / "repo")
    gw = make_gateway(**(FAST | {"distill_consolidate_after": 2}))
    session = AnthropicSession(gw, project, "long-winded")
    # Far more user lines than a log's budget holds: the scripted model writes one
    # 🔴 observation per line and is cut at max_tokens.
    many = "\n".join(f"Decision {i}: the cache key for tenant_{i} is region_{i}."
                     for i in range(400))
    for n, text in enumerate([many, DECISION, "Look at src/billing.py next."]):
        session.say(text)
        wait_until(lambda n=n: len(worker_requests(fake_upstream, "distill")) > n, "a distill")
    (top,) = wait_until(lambda: [d for d in distillations(gw) if d.generation == 1],
                        "the consolidated log")
    first = worker_requests(fake_upstream, "distill")[0]
    assert first.json["max_tokens"] >= fmt.BUDGET_MIN_TOKENS
    logs = read(gw, lambda c: dstore.for_scope(c, None, include_archived=True))
    for log in logs:
        date, bullets = fmt.parse(log.text)
        assert date is not None and bullets, log.text[:300]
        assert log.text.splitlines() == [date, *(b.line() for b in bullets)]
        assert log.method == "worker"
    big = next(d for d in logs if "tenant_0 " in d.text)
    assert len(big.text) <= first.json["max_tokens"] * fmt.CHARS_PER_TOKEN
    merge = worker_requests(fake_upstream, "consolidate")[0]
    gen0 = [d for d in logs if d.generation == 0]
    assert merge.json["max_tokens"] == max(prompts.REFLECTOR_MIN_TOKENS, fmt.consolidation_budget(
        sum(d.input_tokens for d in gen0), sum(fmt.estimate_tokens(d.text) for d in gen0)))
    assert "tangerine branch" in top.text and "src/billing.py" in top.text
