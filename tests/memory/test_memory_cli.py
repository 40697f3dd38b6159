"""``lore recall``, ``lore data`` and ``lore import`` as a user runs them."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lore_gateway.cli.main import _register, app
from lore_gateway.config import Settings
from lore_gateway.memory.service import Memory
from lore_gateway.memory.store.records import TurnRecord
from lore_gateway.protocols.common import Message

DATA = Path(__file__).resolve().parents[1] / "data"
KEY_A = "sk-alice-0123456789abcdefghij"
KEY_B = "sk-bob-0123456789abcdefghijkl"

_register()
runner = CliRunner()


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
             database_url: str | None) -> Path:
    monkeypatch.setenv("LORE_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("LORE_EMBEDDINGS", "false")
    monkeypatch.setenv("KEY_A", KEY_A)
    monkeypatch.setenv("KEY_B", KEY_B)
    return tmp_path


def lore(*args: str, input: str | None = None) -> tuple[int, str]:
    result = runner.invoke(app, list(args), input=input)
    return result.exit_code, result.output


def store(data_dir: Path, *texts_and_headers: tuple[str, dict[str, str]]) -> None:
    memory = Memory.open(Settings(data_dir=data_dir), embedder=None)
    for text, headers in texts_and_headers:
        ident = memory.identify("chat", headers,
                                {"messages": [{"role": "user", "content": text}]})
        memory.submit_turn(TurnRecord(ident, "chat", "m", (Message("user", text),), time.time()))
    memory.flush(5)
    memory.close()


def test_import_is_idempotent_from_the_command_line(data_dir: Path) -> None:
    code, out = lore("import", "codex", str(DATA / "import_codex"))
    assert code == 0, out
    assert "2 files: 3 new turns, 0 already stored" in out
    code, out = lore("import", "codex", str(DATA / "import_codex"))
    assert "2 files: 0 new turns, 3 already stored" in out
    code, out = lore("data", "list", "--json")
    sessions = json.loads(out.splitlines()[-1])["sessions"]
    assert sorted((s["project"], s["turns"]) for s in sessions) == [
        ("/home/dev/infra", 1), ("/home/dev/project", 2)]


def test_recall_finds_an_imported_turn_and_show_prints_the_session(data_dir: Path) -> None:
    lore("import", "claude-code", str(DATA / "import_claude_code"))
    code, out = lore("recall", "login redirects to undefined", "--json")
    assert code == 0, out
    hits = json.loads(out.splitlines()[-1])["hits"]
    assert hits[0]["content"] == "the login page redirects to /undefined after sign-in"
    assert hits[0]["ref"].startswith("t:")
    code, out = lore("recall", "login redirects to undefined")
    assert out.startswith("## Recall Results")
    code, out = lore("data", "show", "7f1c2d3e-5b6a-4c8d-9e0f-1a2b3c4d5e6f")
    assert code == 0 and "great, also add a regression test" in out


def test_two_credentials_are_one_memory_and_commands_need_no_flags(data_dir: Path) -> None:
    store(data_dir,
          ("alice deploys with the blue-green script", {"authorization": f"Bearer {KEY_A}"}),
          ("the canary pipeline deploys on friday", {"x-api-key": KEY_B}))
    code, out = lore("recall", "deploys", "--json")
    assert code == 0, out
    result = json.loads(out.splitlines()[-1])
    assert result["tenants"] == ["personal"] and len(result["hits"]) == 2
    code, out = lore("data", "list", "--json")
    assert code == 0, out
    sessions = json.loads(out.splitlines()[-1])["sessions"]
    assert len(sessions) == 2 and {s["tenant"] for s in sessions} == {"personal"}
    code, out = lore("data", "show", sessions[0]["session"][:6])
    assert code == 0, out
    for path in data_dir.iterdir():
        if path.is_file():
            assert KEY_A.encode() not in path.read_bytes()


def test_team_mode_keys_keep_memories_apart(data_dir: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    code, key_a = lore("keys", "create", "alice")
    assert code == 0 and key_a.startswith("lore_k_")
    key_a = key_a.splitlines()[0]
    key_b = lore("keys", "create", "bob")[1].splitlines()[0]
    monkeypatch.setenv("LORE_TENANCY", "keys")
    monkeypatch.setenv("KEY_A", key_a)
    monkeypatch.setenv("KEY_B", key_b)
    store(data_dir, ("alice deploys with the blue-green script", {"x-lore-key": key_a}),
          ("bob deploys with the canary pipeline", {"x-lore-key": key_b}))
    code, out = lore("data", "list")
    assert code == 2 and "--tenant" in out and "LORE_KEY" in out
    for flags in (("--key-env", "KEY_A"), ("--tenant", "ali")):
        code, out = lore("recall", "deploys", "--json", *flags)
        assert code == 0, out
        contents = [h["content"] for h in json.loads(out.splitlines()[-1])["hits"]]
        assert contents == ["alice deploys with the blue-green script"]
    monkeypatch.setenv("LORE_KEY", key_b)
    code, out = lore("recall", "deploys", "--json")
    contents = [h["content"] for h in json.loads(out.splitlines()[-1])["hits"]]
    assert contents == ["bob deploys with the canary pipeline"]
    code, out = lore("recall", "deploys", "--json", "--all-tenants")
    assert len(json.loads(out.splitlines()[-1])["hits"]) == 2
    assert key_a not in lore("keys", "list")[1]
    for path in data_dir.iterdir():
        if path.is_file():
            assert key_a.encode() not in path.read_bytes()


def test_ids_accept_a_unique_prefix_and_say_when_one_is_not(data_dir: Path) -> None:
    lore("import", "codex", str(DATA / "import_codex"))
    sessions = [s["session"] for s in json.loads(lore("data", "list", "--json")[1])["sessions"]]
    assert all(s.startswith("01") for s in sessions)
    code, out = lore("data", "show", "01")
    assert code == 2 and "ambiguous" in out
    code, out = lore("data", "show", "zz")
    assert code == 2 and "no stored session 'zz'" in out
    code, out = lore("data", "delete", "01a22c2c-a22d", "--yes")
    assert code == 0 and "Deleted session 01a22c2c-a22d-7893-9171-5c3a756c9d51" in out
    assert lore("keys", "create", "carol")[0] == 0
    listed = lore("keys", "list")[1]
    key_id = next(line.split()[1] for line in listed.splitlines() if "carol" in line)
    code, out = lore("keys", "revoke", key_id[:4])
    assert code == 0 and f"Revoked key {key_id}" in out
    assert "revoked" in lore("keys", "list")[1]


def test_delete_asks_first_unless_yes(data_dir: Path) -> None:
    lore("import", "codex", str(DATA / "import_codex"))
    code, out = lore("data", "delete", "/home/dev/project", input="n\n")
    assert code == 1 and "Delete project /home/dev/project (2 turns)?" in out
    assert len(json.loads(lore("data", "list", "--json")[1])["sessions"]) == 2
    code, out = lore("data", "delete", "01a22c2c-a22d-7893-9171-5c3a756c9d51", "--yes")
    assert code == 0 and "Deleted session 01a22c2c-a22d-7893-9171-5c3a756c9d51: 1 turn." in out
    sessions = json.loads(lore("data", "list", "--json")[1])["sessions"]
    assert [s["project"] for s in sessions] == ["/home/dev/project"]
    code, out = lore("data", "delete", "no-such-thing", "--yes")
    assert code == 2 and "no stored session or project" in out


def test_import_of_a_file_that_is_no_transcript_is_a_one_line_error(data_dir: Path,
                                                                      tmp_path: Path) -> None:
    notes = tmp_path / "notes.jsonl"
    notes.write_text('{"todo": "buy milk"}\nplain text\n')
    code, out = lore("import", "claude-code", str(notes))
    assert code == 2, out
    assert "is not a claude-code history file" in out and "Imported" not in out
    assert len(out.strip().splitlines()) == 1
    code, out = lore("import", "codex", str(notes))
    assert code == 2 and "rollout-*.jsonl" in out

    # A project directory with a transcript and a stray file: imported, stray noted;
    # no progress bar drawn on a pipe.
    project = tmp_path / "one-project"
    project.mkdir()
    transcript = next((DATA / "import_claude_code").glob("*/*.jsonl"))
    (project / transcript.name).write_bytes(transcript.read_bytes())
    (project / "stray.jsonl").write_text('{"x": 1}\n')
    code, out = lore("import", "claude-code", str(project))
    assert code == 0, out
    assert "skipped 1 file that is not a claude-code history file" in out
    assert "Imported 1 file: 2 new turns" in out
    assert "━" not in out
