"""Distillation and knowledge storage on a real memory database."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lore_gateway.config import Settings
from lore_gateway.distill import store as dstore
from lore_gateway.knowledge import curator
from lore_gateway.knowledge import store as kstore
from lore_gateway.memory.service import Memory
from lore_gateway.memory.store.records import Identity, TurnRecord
from lore_gateway.protocols.common import Message

ME = Identity("personal", "/work/app", "s1")


@pytest.fixture
def memory(tmp_path: Path, database_url: str | None) -> Iterator[Memory]:
    mem = Memory.open(Settings(data_dir=tmp_path, embeddings=False), embedder=None)
    yield mem
    mem.close()


def store_turns(memory: Memory, count: int, identity: Identity = ME) -> None:
    for i in range(count):
        memory.submit_turn(TurnRecord(identity, "anthropic", "m", (
            Message("user", f"Step {i}: edit src/module_{i}.py and rerun the tests."),
            Message("assistant", f"Edited src/module_{i}.py. " + "Details follow. " * 80)),
            created_at=1_796_000_000.0 + 60 * i), wait=True)
    memory.flush(10)


def test_segments_become_logs_that_keep_their_sources_then_merge(memory: Memory) -> None:
    store_turns(memory, 6)
    made = memory.write_job(
        lambda c: dstore.distill_extractive(c, "personal", "s1", max_tokens=500))
    assert len(made) >= 4
    logs = memory.read(lambda c: dstore.active(c, "personal", "s1", 0))
    sources = [i for d in logs for i in d.source_ids]
    assert sources == sorted(sources) and len(sources) == 12
    assert memory.read(lambda c: dstore.undistilled_tokens(c, "personal", "s1")) == 0
    merged = memory.write_job(lambda c: dstore.consolidate_extractive(c, "personal", "s1", 3))
    assert merged is not None
    (top,) = memory.read(lambda c: dstore.active(c, "personal", "s1"))
    assert top.generation == 1 and sorted(top.source_ids) == sorted(sources)
    assert "src/module_0.py" in top.text and "src/module_5.py" in top.text
    stored = memory.session_messages("personal", "s1")
    assert [m.role for m in stored].count("observations") == len(made) + 1


def test_a_contradiction_updates_the_entry_and_projects_stay_apart(memory: Memory) -> None:
    first = curator.parse_ops('{"ops":[{"op":"create","category":"decision","title":'
                              '"deploy from the tangerine branch","content":"tangerine"}]}')
    later = curator.parse_ops('```json\n{"ops":[{"op":"create","category":"decision","title":'
                              '"deploy from the mandarin branch","content":"mandarin, not '
                              'tangerine"},{"op":"create","category":"preference","title":'
                              '"short answers","content":"keep replies short",'
                              '"cross_project":true},{"op":"create","category":"nonsense",'
                              '"title":"x","content":"y"}]}\n```')
    memory.write_job(lambda c: curator.apply_ops(c, "personal", "/work/app", first, "s1"))
    memory.write_job(lambda c: curator.apply_ops(c, "personal", "/work/app", later, "s1"))
    here = memory.read(lambda c: kstore.entries(c, "personal", "/work/app"))
    assert [(e.category, e.content) for e in here] == [
        ("decision", "mandarin, not tangerine"), ("preference", "keep replies short")]
    elsewhere = memory.read(lambda c: kstore.entries(c, "personal", "/work/other"))
    assert [e.title for e in elsewhere] == ["short answers"]
    stranger = memory.read(lambda c: kstore.entries(c, "t-other", "/work/app"))
    assert stranger == []
    # An operation naming another project's entry does not touch it.
    other = memory.write_job(lambda c: kstore.upsert(
        c, tenant="personal", project="/work/other", category="gotcha", title="flaky port",
        content="8080 is taken")[0])
    delete = curator.parse_ops(json.dumps({"ops": [{"op": "delete", "id": other.id}]}))
    assert memory.write_job(
        lambda c: curator.apply_ops(c, "personal", "/work/app", delete, "s")) == 0


def test_lore_distill_now_distills_every_session_without_a_model(
        memory: Memory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store_turns(memory, 2)
    store_turns(memory, 2, Identity("personal", "/work/app", "s2"))
    memory.close()
    from lore_gateway.cli.main import _register, app

    _register()
    monkeypatch.setenv("LORE_DATA_DIR", str(tmp_path))
    runner = CliRunner()
    result = runner.invoke(app, ["distill", "--now", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == {"sessions": {"s1": 1, "s2": 1}, "distillations": 2}
    again = runner.invoke(app, ["distill", "--now", "--session", "s1", "--json"])
    assert json.loads(again.output)["distillations"] == 0
    refused = runner.invoke(app, ["distill"])
    assert refused.exit_code == 2 and "--now" in refused.output


def test_deleting_a_project_deletes_what_was_learned_from_it(memory: Memory) -> None:
    store_turns(memory, 2)
    memory.write_job(lambda c: dstore.distill_extractive(c, "personal", "s1"))
    memory.write_job(lambda c: kstore.upsert(c, tenant="personal", project="/work/app",
                                             category="decision", title="a b", content="c"))
    memory.write_job(lambda c: kstore.upsert(c, tenant="personal", project="/work/app",
                                             category="preference", title="terse", content="yes",
                                             cross_project=True))
    assert memory.delete("personal", project="/work/app") > 0
    assert memory.read(lambda c: dstore.for_scope(c, None, include_archived=True)) == []
    left = memory.read(lambda c: kstore.entries(c, "personal", None))
    assert [e.title for e in left] == ["terse"]


def test_worker_status_reads_jobs_and_budget_from_the_database(memory: Memory,
                                                               tmp_path: Path) -> None:
    from lore_gateway.worker import jobs
    from lore_gateway.worker.status import describe, status_from_db

    now = __import__("time").time()
    memory.write_job(lambda c: jobs.enqueue(c, "distill", "personal", "/p", "s1", now))
    memory.write_job(lambda c: jobs.charge(c, "personal", now, 1_000, 500))
    memory.flush(10)
    settings = Settings(data_dir=tmp_path, worker_daily_tokens=10_000)
    facts = status_from_db(settings)
    assert facts["enabled"] is True and facts["jobs"]["queued"] == 1
    assert facts["today"]["personal"] == {"requests": 1, "tokens_in": 1_000, "tokens_out": 500,
                                      "budget_left": 8_500}
    assert facts["models"]["anthropic"] == "claude-haiku-4-5"
    assert "10,000 tokens/day" in describe(settings)
    assert "off" in describe(Settings(data_dir=tmp_path, worker=False))


def test_knowledge_cli_edits_deletes_and_exports(
        memory: Memory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import subprocess

    from lore_gateway.knowledge import export as ex

    project = tmp_path / "repo"
    (project / "src").mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    store_turns(memory, 1, Identity("personal", str(project / "src"), "s1"))
    entry = memory.write_job(lambda c: kstore.upsert(
        c, tenant="personal", project=str(project / "src"), category="gotcha",
        title="flaky port", content="8080 is taken by the proxy")[0])
    memory.close()
    from lore_gateway.cli.main import _register, app

    _register()
    monkeypatch.setenv("LORE_DATA_DIR", str(tmp_path))
    run = CliRunner().invoke
    result = run(app, ["knowledge", "export", "--project", str(project / "src"),
                       "--agents-file", "CLAUDE.md"])
    assert result.exit_code == 0, result.output
    lore_md = project / ".lore.md"
    assert f"<!-- lore:{entry.id} -->" in lore_md.read_text()
    assert ex.POINTER_BEGIN in (project / "CLAUDE.md").read_text()
    result = run(app, ["knowledge", "edit", entry.id[:8], "--content", "8081 is taken",
                       "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["content"] == "8081 is taken"
    assert "8081 is taken" in lore_md.read_text()
    shown = json.loads(run(app, ["knowledge", "show", entry.id, "--json"]).output)
    assert shown["title"] == "flaky port" and shown["source"] == "lore knowledge edit"
    bad = run(app, ["knowledge", "edit", entry.id, "--category", "trivia"])
    assert bad.exit_code == 2 and "category must be one of" in bad.output
    assert run(app, ["knowledge", "delete", entry.id]).exit_code == 0
    assert "flaky port" not in lore_md.read_text()
    missing = run(app, ["knowledge", "show", entry.id])
    assert missing.exit_code == 2 and "no knowledge entry" in missing.output
    assert json.loads(run(app, ["knowledge", "list", "--json"]).output) == []


def test_an_id_from_another_tenants_file_does_not_collide(memory: Memory) -> None:
    mine, _ = memory.write_job(lambda c: kstore.upsert(
        c, tenant="personal", project="/p", category="pattern", title="a thing", content="x"))
    theirs, created = memory.write_job(lambda c: kstore.upsert(
        c, tenant="t-other", project="/p", category="pattern", title="a thing", content="y",
        entry_id=mine.id))
    assert created and theirs.id != mine.id and theirs.tenant == "t-other"
