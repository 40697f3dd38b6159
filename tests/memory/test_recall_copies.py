"""Copies of one output are one recall hit that names the others (issue 32, item 5).

An agent runs ``git status`` and the test suite again and again; each run is a new
tool result with a new call id, and often a new duration. A search shows the
best-ranked copy once, says how many it stands for and their ids, and fills the
freed places with other messages. Outputs that differ in what they say stay
apart.
"""

from __future__ import annotations

import re

from lore_gateway.memory.search.dedupe import fold
from lore_gateway.memory.search.hits import Hit
from lore_gateway.memory.service import Memory
from lore_gateway.memory.store.records import Identity, TurnRecord
from lore_gateway.protocols.common import Message, Role
from lore_gateway.storage.base import Connection

TENANT = "tenant-copies"
PROJECT = "/home/dev/src/heronry"
STATUS = "On branch main\nnothing to commit, working tree clean"


def _store(memory: Memory, *messages: tuple[Role, str], session: str = "s") -> None:
    for n, (role, text) in enumerate(messages):
        turn = TurnRecord(identity=Identity(TENANT, PROJECT, f"{session}-{n}"),
                          protocol="responses", model="m",
                          messages=(Message(role, text),), created_at=1.7e9 + n)
        assert memory.submit_turn(turn)
    memory.flush(10)


def _ids(memory: Memory, like: str) -> set[str]:
    def query(conn: Connection) -> set[str]:
        return {f"t:{row[0]}" for row in conn.execute(
            "SELECT id FROM messages WHERE content LIKE ?", (like,))}
    return memory.read(query)


def _search(memory: Memory, query: str, limit: int = 10) -> list[Hit]:
    return memory.search_sync(query, identity=Identity(TENANT, PROJECT, "asking"),
                              limit=limit).hits


def _rendered(memory: Memory, query: str) -> str:
    return memory.render(memory.search_sync(query, identity=Identity(TENANT, PROJECT, "asking")))


def test_the_same_status_line_eight_times_is_one_hit_with_the_count_and_ids(
        memory: Memory) -> None:
    _store(memory, *(("tool", f"[tool:call_{n}] {STATUS}") for n in range(8)),
           ("assistant", "The branch main is clean, so nothing to commit before the tag."))
    copies = _ids(memory, f"%{STATUS}")
    assert len(copies) == 8

    hits = _search(memory, "branch main nothing to commit")
    status = [h for h in hits if STATUS in h.content]
    assert len(status) == 1
    assert {status[0].ref, *status[0].folded} == copies
    assert len(status[0].folded) == 7 and status[0].folded_identical
    assert any("before the tag" in h.content for h in hits)  # the freed place is used

    line = next(x for x in _rendered(memory, "branch main nothing to commit").splitlines()
                if STATUS.split("\n")[1] in x)
    note = re.search(r"\(\+7 identical: ((?:t:\d+(?:, )?)+)\)$", line)
    assert note, line
    assert {status[0].ref, *note.group(1).split(", ")} == copies
    assert f"({status[0].ref}) (+7" in line  # its own id first, then the copies'


def test_runs_that_differ_in_durations_timestamps_and_addresses_fold(
        memory: Memory) -> None:
    runs = [("8.13s", "2026-12-05 10:31:02", "0x7f3a9b2c10", "==================="),
            ("12.02s", "2026-12-05 11:02:45", "0x7f3a9c0080", "=================="),
            ("7.9s", "2026-12-06 09:15:00", "0x55d0c1e2a8", "===================")]
    for n, (took, when, at, pad) in enumerate(runs):
        _store(memory, ("tool", f"[tool:run_{n}] started {when}\n"
                                f"fixture kingfisher at {at}\n"
                                f"{pad} 73 passed, 1 xfailed in {took} {pad}"),
               session=f"run{n}")
    hits = _search(memory, "kingfisher passed xfailed")
    assert len(hits) == 1
    assert len(hits[0].folded) == 2 and not hits[0].folded_identical
    assert "(+2 near-identical: t:" in _rendered(memory, "kingfisher passed xfailed")


def test_outputs_that_say_different_things_do_not_fold(memory: Memory) -> None:
    outputs = [
        "==== 2 failed, 71 passed in 8.13s ==== egret suite",
        "==== 1 failed, 72 passed in 8.13s ==== egret suite",
        "235:def egret_molt(feathers):",
        "229:def egret_molt(feathers):",
        "917  qs = self.egret._default_manager.using(using)",
        "917  qs = self.egret._base_manager.using(using)",
    ]
    _store(memory, *(("tool", f"[tool:c{n}] {text}") for n, text in enumerate(outputs)))
    hits = _search(memory, "egret")
    assert sorted(h.content.split("] ", 1)[1] for h in hits) == sorted(outputs)
    assert not any(h.folded for h in hits)


def test_results_merged_from_two_searches_fold_their_copies_too() -> None:
    """``lore recall --all-tenants`` merges tenants' results the same way."""
    def hit(ref: str, score: float, text: str, folded: tuple[str, ...] = ()) -> Hit:
        return Hit(ref=ref, score=score, role="tool", content=text, created_at=0.0,
                   session="s", project="p", meta=None, folded=folded)

    merged = fold([hit("t:1", 0.9, f"[tool:a] {STATUS}", ("t:2",)),
                   hit("t:5", 0.8, "something else"),
                   hit("t:3", 0.7, f"[tool:b]  {STATUS} ", ("t:4",))])
    assert [h.ref for h in merged] == ["t:1", "t:5"]
    assert merged[0].folded == ("t:2", "t:3", "t:4") and merged[0].folded_identical
