"""The UI's search shows each message once (its copies named under it), and never a
side-channel call or the recall tool's own traffic (issue 33; the other paths:
tests/memory/test_clean_results_paths.py)."""

from __future__ import annotations

import re
import time
import urllib.parse
import urllib.request
from pathlib import Path

from ui_kit import start_gateway

from lore_gateway.memory.store.records import Identity, TurnRecord
from lore_gateway.protocols.common import Message, Role
from lore_gateway.testing import FakeUpstream

QUERY = "osprey nest camera battery"
FACT = "The osprey nest camera battery lasts nine days on the new charger."


def _turn(project: str, session: str, *pairs: tuple[Role, str],
          side: bool = False) -> TurnRecord:
    return TurnRecord(Identity("personal", project, session), "responses", "m",
                      tuple(Message(r, t) for r, t in pairs), time.time(),
                      metas=({"side_channel": True},) * len(pairs) if side else None)


def test_search_shows_each_message_once_without_side_channels_or_recall_traffic(
        fake_upstream: FakeUpstream, tmp_path: Path) -> None:
    runner = start_gateway(fake_upstream, tmp_path / "data")
    try:
        gw = runner.server
        for turn in (
                _turn("/work/birds", "birds-1", ("user", FACT)),
                _turn("/work/birds", "birds-2", ("user", FACT),
                      ("assistant", f'[tool_call:recall] {{"query": "{QUERY}"}}'),
                      ("tool", f"[tool:r1] ## Recall Results\nFound 1 results\n- {FACT}")),
                _turn("unknown", "titles", ("user", f"Write a title for: {FACT}"),
                      ("assistant", "Osprey camera battery"), side=True)):
            assert gw.memory.submit_turn(turn)
        gw.memory.flush(10)
        url = gw.url + "/ui/search?" + urllib.parse.urlencode({"q": QUERY})
        with urllib.request.urlopen(url, timeout=60) as response:
            page = response.read().decode()
        refs = re.findall(r'class="ref" href="/ui/message\?id=(\d+)"', page)
        assert len(refs) == 1, page
        # The second copy of the fact is named under the first (``memory/search/dedupe.py``).
        copies = re.findall(r'class="copy" href="/ui/message\?id=(\d+)">t:(\d+)</a>', page)
        assert "+1 identical: " in page and len(copies) == 1, page
        assert copies[0][0] == copies[0][1] != refs[0]
        assert "Write a title" not in page and "Osprey camera battery" not in page
        assert "Recall Results" not in page and "tool_call:recall" not in page
    finally:
        runner.stop()


def test_a_superseded_message_links_to_its_successor(
        fake_upstream: FakeUpstream, tmp_path: Path) -> None:
    """Issue 36: the stale statement comes after the one that changed it, and says so."""
    runner = start_gateway(fake_upstream, tmp_path / "data")
    try:
        gw = runner.server
        for session, text in (("kiln-1", "Decision: the kiln firing schedule is cone 6."),
                              ("kiln-2", "Decision: set the kiln firing schedule to cone 10.")):
            assert gw.memory.submit_turn(_turn("/work/kiln", session, ("user", text)))
            gw.memory.flush(10)
        url = gw.url + "/ui/search?" + urllib.parse.urlencode({"q": "kiln firing schedule"})
        with urllib.request.urlopen(url, timeout=60) as response:
            page = response.read().decode()
        refs = re.findall(r'class="ref" href="/ui/message\?id=(\d+)"', page)
        assert len(refs) == 2 and page.index("cone 10") < page.index("cone 6"), page
        successor = re.findall(r'class="successor" href="/ui/message\?id=(\d+)">t:(\d+)</a>',
                               page)
        assert successor == [(refs[0], refs[0])], page
        assert f'class="result superseded" id="r{refs[1]}"' in page
    finally:
        runner.stop()
