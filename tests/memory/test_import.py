"""Imports of Codex rollouts and Claude Code transcripts: content, identity, idempotency."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from lore_gateway.config import Settings
from lore_gateway.memory.importers import claude_code, codex, import_files
from lore_gateway.memory.service import Memory

DATA = Path(__file__).resolve().parents[1] / "data"
CODEX_SESSION = "01a22c2a-b6a1-7b61-9872-714c0165ba8a"
CLAUDE_SESSION = "7f1c2d3e-5b6a-4c8d-9e0f-1a2b3c4d5e6f"


@pytest.fixture
def memory(tmp_path: Path, database_url: str | None) -> Iterator[Memory]:
    mem = Memory.open(Settings(data_dir=tmp_path / "lore"), embedder=None)
    yield mem
    mem.close()


def contents(memory: Memory, session: str) -> list[tuple[str, str]]:
    return [(m.role, m.content) for m in memory.session_messages("t-me", session)]


def test_codex_rollouts_become_turns_in_their_sessions_and_projects(memory: Memory) -> None:
    files = codex.find_files(DATA / "import_codex")
    stats = import_files(memory, files, codex.parse, tenant="t-me")
    assert (stats.files, stats.turns_read, stats.turns_new) == (2, 3, 3)

    sessions = {(s.session, s.project, s.turns) for s in memory.sessions("t-me")}
    assert sessions == {(CODEX_SESSION, "/home/dev/project", 2),
                        ("01a22c2c-a22d-7893-9171-5c3a756c9d51", "/home/dev/infra", 1)}
    assert contents(memory, CODEX_SESSION) == [
        ("user", "the tests in parser_test.go fail with a nil map panic, fix it"),
        ("assistant", "[reasoning] **Locating the panic**\n\nRunning the tests to see the "
                      "stack trace."),
        ("assistant", '[tool_call:shell] {"command":["go","test","./parser/..."],'
                      '"workdir":"/home/dev/project"}'),
        ("tool", '[tool:shell] {"output":"--- FAIL: TestParseHeaders\\npanic: assignment to '
                 'entry in nil map\\n\\tparser.go:42","metadata":{"exit_code":1,'
                 '"duration_seconds":1.4}}'),
        ("assistant", "Fixed: `NewParser` now initialises the `seen` map, so "
                      "`TestParseHeaders` passes."),
        ("user", "now bump the version to 1.4.2"),
        ("assistant", "Bumped `version.go` to 1.4.2."),
    ]
    first = memory.session_messages("t-me", CODEX_SESSION)[0]
    assert first.created_at == pytest.approx(1796032805.001)  # 2026-11-30T10:00:05.001Z


def test_claude_code_transcript_skips_meta_and_side_chains(memory: Memory) -> None:
    files = claude_code.find_files(DATA / "import_claude_code")
    stats = import_files(memory, files, claude_code.parse, tenant="t-me")
    assert (stats.files, stats.turns_new) == (1, 2)
    (summary,) = memory.sessions("t-me")
    assert (summary.session, summary.project, summary.turns) == (CLAUDE_SESSION,
                                                                 "/home/dev/webapp", 2)
    assert contents(memory, CLAUDE_SESSION) == [
        ("user", "the login page redirects to /undefined after sign-in"),
        ("assistant", "[reasoning] The redirect target probably comes from a query param."),
        ("assistant", "Let me look at the redirect handler."),
        ("assistant", '[tool_call:Read] {"file_path": "/home/dev/webapp/src/auth/callback.ts"}'),
        ("tool", "[tool:Read] 1\texport function callback(req) {\n2\t  const next = "
                 "req.query.next;\n3\t  return redirect(next);\n4\t}"),
        ("assistant", "`callback` redirects to `req.query.next` without a default; when the "
                      "param is missing it becomes /undefined. I added a fallback to "
                      "`/dashboard`."),
        ("user", "great, also add a regression test"),
        ("assistant", "Added `callback.test.ts` covering the missing `next` parameter."),
    ]


@pytest.mark.parametrize(("module", "root"), [(codex, "import_codex"),
                                              (claude_code, "import_claude_code")])
def test_importing_twice_writes_nothing_new(memory: Memory, module: ModuleType,
                                            root: str) -> None:
    files = module.find_files(DATA / root)
    first = import_files(memory, files, module.parse, tenant="t-me")
    before = [(s.session, s.turns, s.messages) for s in memory.sessions("t-me")]
    second = import_files(memory, files, module.parse, tenant="t-me")
    assert second.turns_new == 0
    assert second.turns_already_stored == first.turns_new
    assert [(s.session, s.turns, s.messages) for s in memory.sessions("t-me")] == before


def test_a_grown_transcript_replaces_its_last_turn_instead_of_duplicating(
        memory: Memory, tmp_path: Path) -> None:
    source = next(iter(codex.find_files(DATA / "import_codex")))
    rollout = tmp_path / source.name
    shutil.copy(source, rollout)
    import_files(memory, [rollout], codex.parse, tenant="t-me")
    session = memory.sessions("t-me")[0].session
    with rollout.open("a") as out:
        out.write(json.dumps({"timestamp": "2026-11-30T10:01:09.000Z", "type": "response_item",
                              "payload": {"type": "message", "role": "assistant", "content": [
                                  {"type": "output_text", "text": "Also tagged v1.4.2."}]}}))
        out.write("\n")
    stats = import_files(memory, [rollout], codex.parse, tenant="t-me")
    assert (stats.turns_new, stats.turns_already_stored) == (1, 1)
    assert memory.sessions("t-me")[0].turns == 2
    assert contents(memory, session)[-3:] == [
        ("user", "now bump the version to 1.4.2"),
        ("assistant", "Bumped `version.go` to 1.4.2."),
        ("assistant", "Also tagged v1.4.2."),
    ]
