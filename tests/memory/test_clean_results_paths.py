"""Every path that searches shows clean results with the asking project first: the
hidden recall tool through the gateway, ``POST /lore/recall`` (``lore recall``
answered by the gateway) and ``lore recall`` searching locally. (The UI's search:
``tests/ui/test_ui_search_clean.py``.)

The same memory everywhere: a fact stored twice, a side-channel title call that
quotes it, recall traffic that repeats it, and another project's session that
matches the question's words better than the asking project's own message.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path
from typing import Any

import aiohttp
import httpx2 as httpx
import pytest
from typer.testing import CliRunner

from lore_gateway.cli.main import _register, app
from lore_gateway.config import Settings
from lore_gateway.local_recall import LOCAL_RECALL_PATH, database_name
from lore_gateway.memory.search.hits import text_key
from lore_gateway.memory.search.render import is_recall_traffic
from lore_gateway.memory.service import Memory
from lore_gateway.memory.store.records import Identity, TurnRecord
from lore_gateway.protocols.common import Message, Role
from lore_gateway.testing import FakeUpstream

KEY = "sk-clean-paths-0123456789abcdef"
QUERY = "kestrel aviary heater thermostat"
FACT = "The kestrel aviary heater thermostat is set to 18 degrees."
ELSEWHERE = ("kestrel aviary heater thermostat: the kestrel aviary heater thermostat "
             "log of the kestrel aviary heater")
TITLE = f"Generate a short title for this conversation: {FACT}"
TOOLS = [{"type": "function", "name": "exec",
          "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}]


def noisy_memory(memory: Memory, tenant: str, home: str, other: str) -> None:
    """The memory every path below searches (see the module docstring)."""
    def turn(project: str, session: str, *pairs: tuple[Role, str],
             side: bool = False) -> TurnRecord:
        return TurnRecord(Identity(tenant, project, session), "responses", "m",
                          tuple(Message(r, t) for r, t in pairs), time.time(),
                          metas=({"side_channel": True},) * len(pairs) if side else None)

    for t in (turn(home, f"{home}-a", ("user", FACT)),
              turn(home, f"{home}-b", ("user", FACT + " "),
                   ("assistant", f'[tool_call:recall] {{"query": "{QUERY}"}}'),
                   ("tool", f"[tool:r1] ## Recall Results\nFound 1 results\n- {FACT} (t:1)"),
                   ("tool", f"[tool:r2] ## Recall Detail: t:1\n{FACT}")),
              turn("unknown", "titles", ("user", TITLE), ("assistant", "Aviary heater"),
                   side=True),
              turn(other, f"{other}-c", ("tool", ELSEWHERE))):
        assert memory.submit_turn(t)
    memory.flush(10)


def assert_clean(contents: list[str]) -> None:
    """One hit per message text, no side channel, no recall traffic; own project first."""
    assert contents, "nothing found"
    keys = [text_key(c) for c in contents]
    assert len(keys) == len(set(keys)), contents
    assert not any(is_recall_traffic(c) or TITLE in c or c == "Aviary heater"
                   for c in contents), contents
    assert text_key(contents[0]) == text_key(FACT), contents
    assert ELSEWHERE in contents  # another project's hit still comes, after


async def test_the_hidden_recall_tool(gateway: Any, fake_upstream: FakeUpstream,
                                      http: aiohttp.ClientSession) -> None:
    home, other = "/work/clean-tool", "/work/clean-tool-elsewhere"
    ident = gateway.memory.identify("responses", {"authorization": f"Bearer {KEY}"}, {})
    await asyncio.to_thread(noisy_memory, gateway.memory, ident.tenant, home, other)
    fake_upstream.script([f"recall:{QUERY}", "text:18 degrees."])
    headers = {"authorization": f"Bearer {KEY}", "x-lore-session-id": "clean-tool-ask",
               "x-lore-project": home}
    body = {"model": "gpt-fake", "input": "What is the heater set to?", "tools": TOOLS}
    async with http.post(gateway.url + "/v1/responses", json=body, headers=headers) as r:
        assert r.status == 200
        await r.read()
    follow = fake_upstream.model_requests[-1].json["input"]
    assert follow[-1]["type"] == "function_call_output"
    output = str(follow[-1]["output"])
    lines = [line for line in output.splitlines() if line.startswith("- (")]
    assert_clean([_line_text(line) for line in lines])
    # The fact stored twice is one hit that names its copy (``memory/search/dedupe.py``).
    assert re.search(r" \(t:\d+\) \(\+1 identical: t:\d+\)$", lines[0]), lines[0]
    for line in lines:  # another project's hit says whose it is; the asking one's not
        assert (f", project {other}) " in line) == (ELSEWHERE in line), line


def _line_text(line: str) -> str:
    """The message text of a rendered result line ``- (role, age[, project p]) text (t:N)``
    (and the copies folded into it after that)."""
    return line.split(") ", 1)[1].rsplit(" (t:", 1)[0]


def test_the_local_recall_route_and_lore_recall_through_it(
        make_gateway: Any, fake_upstream: FakeUpstream,
        monkeypatch: pytest.MonkeyPatch) -> None:
    gw = make_gateway(search_workers=1)
    home, other = "/work/clean-route", "/work/clean-route-elsewhere"
    noisy_memory(gw.memory, "personal", home, other)
    body = {"db": database_name(gw.settings), "query": QUERY, "limit": 10,
            "scope": "all", "project": home}
    answer = httpx.post(gw.url + LOCAL_RECALL_PATH, json=body, timeout=120).json()
    assert_clean([h["content"] for h in answer["hits"]])
    assert len(answer["hits"][0]["folded"]) == 1
    assert f", project {other}) {ELSEWHERE}" in answer["rendered"]
    for name, value in (("LORE_DATA_DIR", str(gw.settings.data_dir)),
                        ("LORE_HOST", "127.0.0.1"), ("LORE_PORT", str(gw.port))):
        monkeypatch.setenv(name, value)
    _register()
    result = CliRunner().invoke(app, ["recall", QUERY, "--project", home, "--json"])
    assert result.exit_code == 0, result.output
    assert_clean([h["content"] for h in json.loads(result.output.splitlines()[-1])["hits"]])


@pytest.mark.usefixtures("database_url")
def test_lore_recall_searching_locally_from_the_working_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "repo"
    (home / "src").mkdir(parents=True)
    monkeypatch.setenv("LORE_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("LORE_EMBEDDINGS", "false")
    monkeypatch.setenv("LORE_PORT", "9")  # no gateway there: the CLI searches locally
    memory = Memory.open(Settings(), embedder=None)
    noisy_memory(memory, "personal", str(home), str(tmp_path / "elsewhere"))
    memory.close()
    monkeypatch.chdir(home / "src")  # a subdirectory of the stored project
    _register()
    result = CliRunner().invoke(app, ["recall", QUERY, "--json"])
    assert result.exit_code == 0, result.output
    assert_clean([h["content"] for h in json.loads(result.output.splitlines()[-1])["hits"]])
    text = CliRunner().invoke(app, ["recall", QUERY]).output
    assert f", project {tmp_path / 'elsewhere'}) {ELSEWHERE}" in text
    assert f", project {home}" not in text
