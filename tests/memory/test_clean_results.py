"""What a search result never holds, and whose results come first (issue 33).

One hit per message text, no side-channel call, no recall traffic, even when such
rows fill the top of the ranking; in scope ``all`` the asking project's messages
outrank other projects' unless the question names another project, and hits from
another project are labelled with it in the recall text.
"""

from __future__ import annotations

import pytest

from lore_gateway.memory.search import projects
from lore_gateway.memory.search.hits import text_key
from lore_gateway.memory.search.render import is_recall_traffic, render
from lore_gateway.memory.service import Memory
from lore_gateway.memory.store.records import Identity, TurnRecord
from lore_gateway.protocols.common import Message, Role

TENANT = "tenant-clean"
HOME = "/home/dev/src/aviary"
OTHER = "/home/dev/src/ledger-9"
SIDE = {"side_channel": True}


def _turn(project: str, session: str, *pairs: tuple[Role, str],
          side: bool = False) -> TurnRecord:
    return TurnRecord(identity=Identity(TENANT, project, session), protocol="responses",
                      model="m", messages=tuple(Message(r, t) for r, t in pairs),
                      created_at=1.7e9, metas=(SIDE,) * len(pairs) if side else None)


def _store(memory: Memory, *turns: TurnRecord) -> None:
    for t in turns:
        assert memory.submit_turn(t)
    memory.flush(10)


def _search(memory: Memory, query: str, project: str = HOME, scope: str = "all",
            limit: int = 10) -> list[tuple[str, str]]:
    result = memory.search_sync(query, identity=Identity(TENANT, project, "asking"),
                                scope=scope, limit=limit)
    return [(h.project, h.content) for h in result.hits]


def test_one_hit_per_message_text(memory: Memory) -> None:
    output = "FAILED tests/test_perch.py::test_molt - KeyError: 'plumage'"
    _store(memory,
           _turn(HOME, "a", ("tool", output)),
           _turn(HOME, "b", ("tool", output + "\n")),  # the same text, stored again
           _turn(HOME, "b", ("tool", "  FAILED tests/test_perch.py::test_molt -  KeyError: "
                                     "'plumage'")),
           _turn(HOME, "c", ("assistant", "The perch molt test fails on the plumage key.")))
    hits = _search(memory, "perch molt plumage")
    keys = [text_key(c) for _, c in hits]
    assert len(keys) == len(set(keys)) == 2


def test_side_channel_calls_are_never_hits(memory: Memory) -> None:
    task = "Fix the aviary feeder: the millet hopper jams every morning"
    _store(memory,
           _turn(HOME, "main", ("user", task), ("assistant", "Looking at the millet hopper.")),
           _turn("unknown", "titles", ("user", f"Generate a title for: {task}"),
                 ("assistant", "Millet hopper jams"), side=True))
    hits = _search(memory, "millet hopper jams")
    assert hits and all(p == HOME for p, _ in hits)
    assert not any("Generate a title" in c or c == "Millet hopper jams" for _, c in hits)


def test_every_kind_of_recall_traffic_is_left_out(memory: Memory) -> None:
    traffic = [
        ("assistant", '[tool_call:recall] {"query": "cassowary gate latch"}'),
        ("tool", "[tool:t1] ## Recall Results\nFound 1 results: cassowary gate latch"),
        ("tool", "[tool:t2] ## Recall Detail: t:1\n#### Conversation\ncassowary gate latch"),
        ("tool", "[tool:t3] ## Recall Details\n### Detail: t:1\ncassowary gate latch"),
        ("tool", "[tool:t4] Recall timed out: the memory system did not answer in time."),
    ]
    assert all(is_recall_traffic(text) for _, text in traffic)
    assert not is_recall_traffic("[tool:t5] ## Recall of the cassowary gate (my own notes)")
    _store(memory, _turn(HOME, "s", ("user", "the cassowary gate latch sticks"), *traffic,
                         ("assistant", "Oil the cassowary gate latch weekly.")))
    hits = _search(memory, "cassowary gate latch")
    assert sorted(c for _, c in hits) == ["Oil the cassowary gate latch weekly.",
                                          "the cassowary gate latch sticks"]


def test_a_result_stays_full_when_noise_ranks_first(memory: Memory) -> None:
    # Forty side-channel rows match better (they repeat the words) than the real ones.
    _store(memory, *(_turn("unknown", "titles", ("user", f"Title for: heron pond filter "
                                                         f"heron pond filter ({i})"), side=True)
                     for i in range(40)),
           *(_turn(HOME, "s", ("assistant", f"Step {i}: cleaned the heron pond filter."))
             for i in range(12)))
    hits = _search(memory, "heron pond filter")
    assert len(hits) == 10 and all(c.startswith("Step") for _, c in hits)


def _two_projects(memory: Memory) -> None:
    """The other project says more about the question's words than the asking one."""
    _store(memory,
           _turn(OTHER, "o1", ("tool", "retry budget exceeded: the webhook retry budget is "
                                       "5, retry budget exhausted after 5 webhook retries")),
           _turn(OTHER, "o2", ("assistant", "Raised the webhook retry budget to 8.")),
           _turn(HOME, "h1", ("assistant", "The webhook retry budget here stays at 3.")))


def test_the_asking_project_comes_first_in_scope_all(memory: Memory) -> None:
    _two_projects(memory)
    home_first = _search(memory, "webhook retry budget")
    assert home_first[0][0] == HOME and {p for p, _ in home_first} == {HOME, OTHER}
    assert _search(memory, "webhook retry budget", project=OTHER)[0][0] == OTHER
    # From no project (or ``unknown``) the ranking alone decides.
    assert _search(memory, "webhook retry budget", project="")[0][0] == OTHER
    assert _search(memory, "webhook retry budget", project="unknown")[0][0] == OTHER
    # ``lore recall`` from a subdirectory of the stored project favours it too.
    assert _search(memory, "webhook retry budget", project=HOME + "/src/hooks")[0][0] == HOME


def test_a_question_that_names_another_project_goes_there(memory: Memory) -> None:
    _store(memory, _turn(OTHER, "o3", ("assistant", "The webhook retry budget is per tenant.")),
           _turn(HOME, "h2", ("assistant", "The webhook retry budget is per tenant, I think, "
                                           "and the webhook retry budget is global too.")))
    assert _search(memory, "webhook retry budget per tenant")[0][0] == HOME
    assert _search(memory, "webhook retry budget per tenant in ledger-9")[0][0] == OTHER
    assert _search(memory, f"webhook retry budget per tenant in {OTHER}/hooks.py")[0][0] == OTHER
    # A path outside every stored project points nowhere in memory: no change.
    assert _search(memory, "webhook retry budget per tenant /usr/lib/python3/x.py")[0][0] == HOME


def test_hits_of_another_project_are_labelled_with_it(memory: Memory) -> None:
    _two_projects(memory)
    result = memory.search_sync("webhook retry budget", identity=Identity(TENANT, HOME, "x"),
                                scope="all")
    lines = [line for line in render(result).splitlines() if line.startswith("- (")]
    assert lines and all(("project " + OTHER in line) == ("webhook retries" in line
                                                         or "to 8" in line) for line in lines)
    assert not any("project " + HOME in line for line in lines)
    # Scope session: every hit is the asking session's, nothing to label.
    own = memory.search_sync("webhook retry budget", identity=Identity(TENANT, HOME, "h1"),
                             scope="session")
    assert own.hits and "project " not in render(own)


@pytest.mark.parametrize(("query", "named"), [
    ("why did the main function fail", False),
    ("what did we decide in the main repo", True),
    ("which flag does ledger-9 set", True),
    ("how does the ledger work", False),
])
def test_a_plain_word_names_a_project_only_next_to_a_project_word(query: str,
                                                                  named: bool) -> None:
    chosen = projects.favoured(query, HOME, {HOME, "/work/main", OTHER})
    assert chosen is not None
    assert (chosen != {HOME}) is named


def test_paths_relate_when_one_holds_the_other() -> None:
    assert projects.related(HOME, HOME + "/src") and projects.related(HOME + "/", HOME)
    assert not projects.related(HOME, HOME + "-old") and not projects.related("/", HOME)
    assert projects.label(OTHER, HOME) == OTHER and projects.label(HOME + "/x", HOME) == ""
    assert projects.label(OTHER, "") == "" and projects.label("/p/" + "x" * 100, HOME)[0] == "…"
