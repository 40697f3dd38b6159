"""Listing commands at 80 columns on a terminal, as plain lines when piped, and --json.

A listing is readable when no line is wider than the terminal and every path, URL
and id is still whole on one line (nothing cut or split mid-token).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from clikit import lore, lore_env, on_terminal

from lore_gateway.config import Settings
from lore_gateway.memory.service import Memory
from lore_gateway.memory.store.records import Identity, TurnRecord
from lore_gateway.memory.tenancy.identity import PERSONAL
from lore_gateway.protocols.common import Message

PROJECT = "/home/someone/work/a-rather-long-project-directory-name/services/api"
SESSIONS = ("019a2b3c-4d5e-6f70-8192-a3b4c5d6e7f8", "7f1c2d3e-5b6a-4c8d-9e0f-1a2b3c4d5e6f")
BOX = set("│┃━─┏┓┗┛╭╮╰╯")


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    memory = Memory.open(Settings(data_dir=tmp_path / "data", embeddings=False), embedder=None)
    for turns, session in enumerate(SESSIONS, start=1):
        for n in range(turns):
            text = f"turn {n} of {session}"
            memory.submit_turn(TurnRecord(Identity(PERSONAL, PROJECT, session), "chat", "m",
                                          (Message("user", text),), time.time()))
    memory.flush(10)
    memory.close()
    return lore_env(tmp_path)


def assert_fits(text: str, *whole: str, columns: int = 80) -> list[str]:
    lines = text.splitlines()
    assert lines, "nothing printed"
    for line in lines:
        assert len(line) <= columns, f"{len(line)} columns: {line!r}\n{text}"
    for token in whole:
        assert any(token in line for line in lines), f"{token!r} is split or missing:\n{text}"
    return lines


def assert_plain(text: str, header: str) -> list[list[str]]:
    assert not BOX & set(text) and "\x1b" not in text, text
    lines = text.splitlines()
    assert header in lines, text
    return [line.split("\t") for line in lines[lines.index(header) + 1:]]


def test_data_list(env: dict[str, str]):
    shown = on_terminal(env, "data", "list")
    lines = assert_fits(shown, PROJECT, *SESSIONS, "activity")
    assert PROJECT in lines  # its heading: the count did not fit beside it
    assert f"{PROJECT[-30:]}  (2 sessions)" in on_terminal(env, "data", "list", columns=120)

    rows = assert_plain(lore(env, "data", "list").stdout,
                        "project\tsession\tturns\tmessages\tlast activity")
    assert sorted((r[0], r[1], r[2]) for r in rows) == [(PROJECT, SESSIONS[0], "1"),
                                                        (PROJECT, SESSIONS[1], "2")]
    listed = json.loads(lore(env, "data", "list", "--json").stdout)
    assert {s["session"] for s in listed["sessions"]} == set(SESSIONS)


def test_doctor(env: dict[str, str], tmp_path: Path):
    env = env | {"LORE_UPSTREAM_OPENAI": "http://127.0.0.1:1", "LORE_PORT": "1"}
    codex_config = f"{tmp_path}/home/.codex/config.toml"
    for columns in (80, 200):  # 80: too narrow for these long paths side by side
        assert_fits(on_terminal(env, "doctor", columns=columns), "http://127.0.0.1:1",
                    codex_config, "`lore run codex`,", columns=columns)
    assert "fix: use `lore run codex`," in on_terminal(env, "doctor", columns=200)

    rows = assert_plain(lore(env, "doctor").stdout, "check\tstatus\tdetail\tfix")
    assert ["agent codex", "warn", f"{codex_config} does not point at lore",
            "use `lore run codex`, or `lore setup codex` to make it stick"] in rows
    checks = json.loads(lore(env, "doctor", "--json").stdout)["checks"]
    assert {c["name"] for c in checks} >= {"gateway", "data dir", "database", "agent claude"}


def test_setup_status(env: dict[str, str], tmp_path: Path):
    claude_settings = f"{tmp_path}/home/.claude/settings.json"
    assert_fits(on_terminal(env, "setup", "--status"), claude_settings, "http://127.0.0.1:3207")

    rows = assert_plain(lore(env, "setup", "--status").stdout,
                        "agent\tconfig\tset up by lore\tpoints at gateway")
    assert ["claude", f"{claude_settings} (absent)", "no", "no"] in rows
    agents = json.loads(lore(env, "setup", "--status", "--json").stdout)["agents"]
    assert agents["claude"]["config"] == claude_settings


def test_config_show(env: dict[str, str], tmp_path: Path):
    assert_fits(on_terminal(env, "config", "show"), "https://chatgpt.com/backend-api",
                f"{tmp_path}/data", "env LORE_DATA_DIR")


def test_status(env: dict[str, str], tmp_path: Path):
    lines = assert_fits(on_terminal(env | {"LORE_PORT": "1"}, "status"),
                        "https://chatgpt.com/backend-api", f"{tmp_path}/data")
    database = next(line for line in lines if line.startswith("database"))
    assert "2 sessions, 3 turns, 3 messages" in database


def test_plurals_in_counts(env: dict[str, str], tmp_path: Path):
    result = lore(env, "data", "delete", SESSIONS[0], "--yes")
    assert result.stdout == f"Deleted session {SESSIONS[0]}: 1 turn.\n"
    document = json.loads(lore(env | {"LORE_PORT": "1"}, "status", "--json").stdout)
    assert document["database"]["sessions"] == 1
    plain = dict(line.split("\t") for line in lore(env | {"LORE_PORT": "1"}, "status")
                 .stdout.splitlines())
    assert plain["database"].endswith("1 session, 2 turns, 2 messages")


def test_recall_results_wrap_at_spaces(env: dict[str, str]):
    long_words = " ".join(f"word{n:03d}" for n in range(40))
    memory = Memory.open(Settings(data_dir=Path(env["LORE_DATA_DIR"]), embeddings=False),
                         embedder=None)
    memory.submit_turn(TurnRecord(Identity(PERSONAL, PROJECT, SESSIONS[0]), "chat", "m",
                                  (Message("user", f"deploy notes {long_words}"),), time.time()))
    memory.flush(10)
    memory.close()

    shown = on_terminal(env, "recall", "deploy notes")
    lines = assert_fits(shown)
    words = " ".join(shown.split())
    assert long_words in words  # every word whole, in order
    assert any(line.startswith("  word") for line in lines)  # hung under its list item

    piped = lore(env, "recall", "deploy notes").stdout
    assert any(long_words in line for line in piped.splitlines())  # piped: not wrapped
