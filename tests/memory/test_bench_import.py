"""``lore bench import``: the coding set as Claude Code transcripts, one message each."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lore_gateway.bench.importing import write_transcripts
from lore_gateway.cli.main import _register, app
from lore_gateway.memory.importers import claude_code

_register()

SET = {"sessions": [
    {"session_id": "proj__one-1", "messages": [
        {"role": "user", "content": "Fix the crash in the parser."},
        {"role": "assistant", "content": "THOUGHT: look first.\n```bash\ncat parser.py\n```"},
        {"role": "tool", "content": "<returncode>0</returncode>\n<output>def parse(): ...</output>"
         },
        {"role": "user", "content": "Please always include exactly one bash block."},
        {"role": "assistant", "content": "```bash\npytest -q\n```"}]},
    {"session_id": "proj__two-2", "messages": [
        {"role": "user", "content": "Add a --verbose flag."},
        {"role": "assistant", "content": "Done."}]},
]}


@pytest.mark.usefixtures("database_url")
def test_transcripts_keep_every_message_and_the_bench_reports(tmp_path: Path) -> None:
    data = tmp_path / "set.json"
    data.write_text(json.dumps(SET))
    files = write_transcripts(data, tmp_path / "projects")
    assert [f.stem for f in files] == ["proj__one-1", "proj__two-2"]
    assert all(claude_code.is_transcript(f) for f in files)
    stored = [m for f in files for turn in claude_code.parse(f, "personal") for m in turn.messages]
    assert [m.role for m in stored] == ["user", "assistant", "tool", "user", "assistant",
                                        "user", "assistant"]
    assert stored[2].text.endswith("<output>def parse(): ...</output>")

    result = CliRunner().invoke(app, ["bench", "import", "--data", str(data),
                                      "--no-embeddings", "--json"])
    assert result.exit_code == 0, result.output
    figures = json.loads(result.output.splitlines()[-1])
    assert (figures["sessions"], figures["messages"], figures["embeddings"]) == (2, 7, False)
    assert figures["slowest_session"]["messages"] in (5, 2)
