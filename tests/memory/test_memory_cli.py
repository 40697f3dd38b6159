"""``lore recall``, ``lore data`` and ``lore import`` as a user runs them."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lore_gateway.cli.main import _register, app
from lore_gateway.config import Settings
from lore_gateway.memory.records import TurnRecord
from lore_gateway.memory.service import Memory
from lore_gateway.protocols.common import Message

DATA = Path(__file__).resolve().parents[1] / "data"
KEY_A = "sk-alice-0123456789abcdefghij"
KEY_B = "sk-bob-0123456789abcdefghijkl"

_register()
runner = CliRunner()


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("LORE_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("LORE_EMBEDDINGS", "false")
    monkeypatch.setenv("KEY_A", KEY_A)
    monkeypatch.setenv("KEY_B", KEY_B)
    return tmp_path


def lore(*args: str, input: str | None = None) -> tuple[int, str]:
    result = runner.invoke(app, list(args), input=input)
    return result.exit_code, result.output


def store_two_tenants(data_dir: Path) -> None:
    memory = Memory.open(Settings(data_dir=data_dir), embedder=None)
    for key, text in ((KEY_A, "alice deploys with the blue-green script"),
                      (KEY_B, "bob deploys with the canary pipeline")):
        ident = memory.identify("chat", {"authorization": f"Bearer {key}"},
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


def test_several_tenants_require_a_choice_and_stay_apart(data_dir: Path) -> None:
    store_two_tenants(data_dir)
    code, out = lore("data", "list")
    assert code == 2 and "2 tenants" in out
    code, out = lore("recall", "deploys", "--json", "--key-env", "KEY_A")
    contents = [h["content"] for h in json.loads(out.splitlines()[-1])["hits"]]
    assert contents == ["alice deploys with the blue-green script"]
    code, out = lore("recall", "deploys", "--json", "--all-tenants")
    assert len(json.loads(out.splitlines()[-1])["hits"]) == 2
    for path in data_dir.iterdir():
        assert KEY_A.encode() not in path.read_bytes()
    assert KEY_A not in out


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
