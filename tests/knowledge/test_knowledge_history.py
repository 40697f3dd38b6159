"""Knowledge history on a real memory database: every path that changes an entry
leaves a version with its actor and both states; ``lore knowledge log|diff``
through the real CLI; the bound; tenants; what forgetting takes with it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from lore_gateway.config import Settings
from lore_gateway.distill import store as dstore
from lore_gateway.knowledge import curator, history, sync
from lore_gateway.knowledge import export as ex
from lore_gateway.knowledge import store as kstore
from lore_gateway.memory.data import forget
from lore_gateway.memory.service import Memory

ME = "personal"


@pytest.fixture
def memory(tmp_path: Path, database_url: str | None) -> Iterator[Memory]:
    mem = Memory.open(Settings(data_dir=tmp_path, embeddings=False), embedder=None)
    yield mem
    mem.close()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    (root / ".git").mkdir(parents=True)
    return root


def lore(data_dir: Path, monkeypatch: pytest.MonkeyPatch, *args: str) -> Any:
    from lore_gateway.cli.main import _register, app

    _register()
    monkeypatch.setenv("LORE_DATA_DIR", str(data_dir))
    monkeypatch.setenv("LORE_EMBEDDINGS", "false")
    return CliRunner().invoke(app, list(args))


def ops(*items: dict[str, Any]) -> list[curator.Op]:
    return curator.parse_ops(json.dumps({"ops": list(items)}))


def versions(memory: Memory, entry_id: str, tenant: str = ME) -> list[history.Version]:
    return list(memory.read(lambda c: history.versions(c, tenant, entry_id)))


def curate(memory: Memory, project: str, *items: dict[str, Any]) -> None:
    memory.write_job(lambda c: curator.apply_ops(c, ME, project, ops(*items), "s1"))


def test_every_path_that_changes_an_entry_leaves_a_version(
        memory: Memory, repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    project = str(repo)
    curate(memory, project, {"op": "create", "category": "decision",
                             "title": "datastore for the cache", "content": "Postgres."})
    (entry,) = memory.read(lambda c: kstore.entries(c, ME, project))
    # The curator updates it by id, then asserts the same again (no version).
    for _ in range(2):
        curate(memory, project, {"op": "update", "id": entry.id, "category": "decision",
                                 "title": "datastore for the cache",
                                 "content": "Postgres, with a read replica."})
    # A create whose title matches, saying something else, supersedes the content.
    curate(memory, project, {"op": "create", "category": "decision",
                             "title": "the datastore for the cache", "content": "SQLite."})
    # A person's edit through the CLI.
    result = lore(tmp_path, monkeypatch, "knowledge", "edit", entry.id[:8], "--content",
                  "SQLite, in WAL mode.")
    assert result.exit_code == 0, result.output
    # A person's edit of .lore.md, imported at the next session.
    memory.write_job(lambda c: sync.export(c, ME, project, repo, None))
    lore_md = repo / ex.FILE_NAME
    lore_md.write_text(lore_md.read_text().replace("SQLite, in WAL mode.",
                                                   "SQLite in WAL mode; one writer."))
    assert memory.write_job(lambda c: sync.import_edits(c, ME, project, repo)) == 1
    result = lore(tmp_path, monkeypatch, "knowledge", "delete", entry.id[:8])
    assert result.exit_code == 0, result.output

    kept = versions(memory, entry.id)
    assert [(v.version, v.change, v.actor) for v in kept] == [
        (1, "created", "curator"), (2, "updated", "curator"), (3, "superseded", "curator"),
        (4, "updated", "user"), (5, "imported", "import"), (6, "deleted", "user")]
    contents = [(v.before.content if v.before else None, v.after.content if v.after else None)
                for v in kept]
    assert contents == [
        (None, "Postgres."), ("Postgres.", "Postgres, with a read replica."),
        ("Postgres, with a read replica.", "SQLite."), ("SQLite.", "SQLite, in WAL mode."),
        ("SQLite, in WAL mode.", "SQLite in WAL mode; one writer."),
        ("SQLite in WAL mode; one writer.", None)]
    assert kept[0].source == "s1" and kept[4].source == sync.MANUAL_SOURCE
    assert kept[2].after is not None and kept[2].after.title == "the datastore for the cache"
    assert {(v.tenant, v.project) for v in kept} == {(ME, project)}


def test_log_and_diff_through_the_cli(memory: Memory, tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    project = "/work/app"
    curate(memory, project, {"op": "create", "category": "gotcha", "title": "cache ttl",
                             "content": "The TTL is 30 s.\nKeys expire together."})
    curate(memory, project, {"op": "create", "category": "gotcha", "title": "cache ttl",
                             "content": "The TTL is 300 s.\nKeys expire together."})
    curate(memory, project, {"op": "create", "category": "pattern", "title": "test runner",
                             "content": "make test"})
    ttl = memory.read(lambda c: kstore.entries(c, ME, project))[0]
    assert ttl.title == "cache ttl"

    result = lore(tmp_path, monkeypatch, "knowledge", "log", "--json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert [(r["after"]["title"], r["change"]) for r in rows] == [
        ("test runner", "created"), ("cache ttl", "superseded"), ("cache ttl", "created")]
    assert rows[1]["before"]["content"].startswith("The TTL is 30 s.")
    result = lore(tmp_path, monkeypatch, "knowledge", "log", ttl.id[:6])
    assert result.exit_code == 0, result.output
    assert "superseded" in result.output and "test runner" not in result.output
    header, *lines = result.output.splitlines()  # not a terminal: tab-separated
    assert header.split("\t") == ["when", "id", "v", "change", "by", "title"]
    assert [line.split("\t")[1:5] for line in lines] == [
        [ttl.id[:8], "2", "superseded", "curator"], [ttl.id[:8], "1", "created", "curator"]]

    result = lore(tmp_path, monkeypatch, "knowledge", "diff", ttl.id[:6])
    assert result.exit_code == 0, result.output
    assert "-The TTL is 30 s.\n+The TTL is 300 s.\n Keys expire together." in result.output
    result = lore(tmp_path, monkeypatch, "knowledge", "diff", ttl.id, "--to", "1", "--json")
    shown = json.loads(result.output)
    assert shown["before"] is None and shown["to"] == 1 and shown["change"] == "created"
    assert "+The TTL is 30 s." in shown["diff"]
    result = lore(tmp_path, monkeypatch, "knowledge", "diff", ttl.id, "--from", "1",
                  "--to", "2", "--json")
    assert "-The TTL is 30 s." in json.loads(result.output)["diff"]
    result = lore(tmp_path, monkeypatch, "knowledge", "diff", ttl.id, "--from", "7")
    assert result.exit_code == 2 and "no version 7" in result.output
    result = lore(tmp_path, monkeypatch, "knowledge", "log", "ffffffff")
    assert result.exit_code == 2 and "no history" in result.output


def test_an_entry_keeps_its_newest_versions_up_to_the_bound(memory: Memory) -> None:
    entry, _ = memory.write_job(lambda c: kstore.upsert(
        c, tenant=ME, project="/work/app", category="decision", title="release train",
        content="version 0"))
    extra = 5
    for n in range(1, history.MAX_VERSIONS_PER_ENTRY + extra):
        memory.write_job(lambda c, n=n: kstore.upsert(
            c, tenant=ME, project="/work/app", category="decision", title="release train",
            content=f"version {n}", entry_id=entry.id))
    kept = versions(memory, entry.id)
    assert len(kept) == history.MAX_VERSIONS_PER_ENTRY
    newest = history.MAX_VERSIONS_PER_ENTRY + extra
    assert kept[0].version == extra + 1 and kept[-1].version == newest
    assert kept[-1].after is not None and kept[-1].after.content == (
        f"version {newest - 1}")


def test_a_key_sees_only_its_tenants_history(memory: Memory, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    key_a = lore(tmp_path, monkeypatch, "keys", "create", "alice").output.splitlines()[0]
    assert key_a.startswith("lore_k_")
    lore(tmp_path, monkeypatch, "keys", "create", "bob")
    entries = {}
    for tenant in ("alice", "bob"):
        entries[tenant], _ = memory.write_job(lambda c, t=tenant: kstore.upsert(
            c, tenant=t, project="/work/shared", category="decision", title="deploy branch",
            content=f"{t} deploys from main"))
    monkeypatch.setenv("LORE_TENANCY", "keys")
    monkeypatch.setenv("KEY_A", key_a)
    result = lore(tmp_path, monkeypatch, "knowledge", "log", "--key-env", "KEY_A", "--json")
    assert result.exit_code == 0, result.output
    assert [r["tenant"] for r in json.loads(result.output)] == ["alice"]
    bob = entries["bob"].id
    for command in ("log", "diff"):
        result = lore(tmp_path, monkeypatch, "knowledge", command, bob, "--key-env", "KEY_A")
        assert result.exit_code == 2 and "no history" in result.output
    result = lore(tmp_path, monkeypatch, "knowledge", "log", "--all-tenants", "--json")
    assert {r["tenant"] for r in json.loads(result.output)} == {"alice", "bob"}


def test_forgetting_a_project_or_a_text_takes_the_history_with_it(memory: Memory) -> None:
    curate(memory, "/work/gone", {"op": "create", "category": "decision", "title": "queue",
                                  "content": "RabbitMQ"},
           {"op": "create", "category": "preference", "title": "short answers",
            "content": "keep replies short", "cross_project": True})
    curate(memory, "/work/gone", {"op": "create", "category": "decision", "title": "old queue",
                                  "content": "Kafka"})
    gone = memory.read(lambda c: kstore.entries(c, ME, "/work/gone", include_cross=False))
    memory.write_job(lambda c: kstore.delete(c, ME, next(
        e.id for e in gone if e.title == "old queue")))
    memory.write_job(lambda c: dstore.forget(c, ME, project="/work/gone"))
    left = memory.read(lambda c: history.log(c, ME, None))
    assert [v.title for v in left] == ["short answers"]  # the user's own habit stays

    # A text forgotten goes from every version that held it, not only the newest.
    curate(memory, "/work/app", {"op": "create", "category": "gotcha", "title": "api token",
                                 "content": "the token is hunter2"})
    curate(memory, "/work/app", {"op": "create", "category": "gotcha", "title": "api token",
                                 "content": "the token lives in the vault"})
    memory.write_job(lambda c: forget.forget(c, ME, forget.Selector(match="vault")))
    assert memory.read(lambda c: kstore.entries(c, ME, "/work/app", include_cross=False)) == []
    assert [v.title for v in memory.read(lambda c: history.log(c, ME, "/work/app"))] == []


@pytest.mark.usefixtures("database_url")
def test_a_database_before_history_migrates_and_its_entries_gain_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    memory = Memory.open(Settings(data_dir=tmp_path, embeddings=False), embedder=None)
    try:
        entry, _ = memory.write_job(lambda c: kstore.upsert(
            c, tenant=ME, project="/work/app", category="decision", title="queue",
            content="RabbitMQ"))

        def back_to_v13(conn: Any) -> None:  # as a database written before v14
            with conn:
                conn.execute("DROP TABLE knowledge_history")
                conn.execute("DELETE FROM schema_version WHERE version = 14")

        memory.write_job(back_to_v13)
    finally:
        memory.close()
    result = lore(tmp_path, monkeypatch, "db", "status", "--json")
    assert json.loads(result.output)["schema_version"] == 13
    result = lore(tmp_path, monkeypatch, "db", "migrate")
    assert result.exit_code == 0, result.output
    assert "schema v14: knowledge: history of every change to an entry" in result.output
    assert "from schema version 13 to 14" in result.output
    facts = json.loads(lore(tmp_path, monkeypatch, "db", "status", "--json").output)
    assert facts["schema_version"] == facts["latest_version"] == 14
    # The entry has no version yet; its first change keeps what it said before.
    result = lore(tmp_path, monkeypatch, "knowledge", "edit", entry.id, "--content", "Redis")
    assert result.exit_code == 0, result.output
    shown = json.loads(lore(tmp_path, monkeypatch, "knowledge", "diff", entry.id,
                            "--json").output)
    assert (shown["before"]["content"], shown["after"]["content"]) == ("RabbitMQ", "Redis")
