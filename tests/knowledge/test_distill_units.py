"""The observation-log format, the extractive distiller, and .lore.md parsing."""

from __future__ import annotations

import math

from lore_gateway.distill import extractive
from lore_gateway.distill import format as fmt
from lore_gateway.distill.extractive import SourceMessage
from lore_gateway.knowledge import export as ex
from lore_gateway.knowledge.sidechannel import is_coding_turn
from lore_gateway.knowledge.store import Entry, same_title
from lore_gateway.worker import requests as wreq

T0 = 1_796_000_000.0


def msg(i: int, role: str, text: str) -> SourceMessage:
    return SourceMessage(i, role, text, T0 + 60 * i)


def test_budget_grows_sub_linearly_within_its_bounds() -> None:
    assert fmt.budget_tokens(0) == 256
    assert fmt.budget_tokens(10_000) == 1000
    assert fmt.budget_tokens(10_000_000) == 4096
    assert fmt.budget_tokens(40_000) / fmt.budget_tokens(10_000) == math.sqrt(4)


def test_extractive_log_keeps_the_user_errors_results_and_identifiers() -> None:
    log = extractive.distill([
        msg(1, "user", "<environment_context><cwd>/r</cwd></environment_context>\n"
                       "Never touch vendor/; use `make fmt` before committing 3f2a9c1."),
        msg(2, "assistant", "The root cause is the stale cache in src/cache.py.\n\n"
                            "```bash\npython -m pytest tests/test_cache.py -q\n```"),
        msg(3, "tool", "F.\nE   KeyError: 'user_id'\n=== 1 failed, 1 passed in 0.12s ===\n"
                       "src/cache.py:42:def refresh_entries(self):"),
    ])
    lines = log.splitlines()
    assert lines[0].startswith("Date: ")
    assert lines[1].startswith("* 🔴 (") and "3f2a9c1" in lines[1] and "<cwd>" not in log
    assert "* 🟡" in log and "root cause is the stale cache in src/cache.py" in log
    assert "KeyError: 'user_id'" in log and "1 failed, 1 passed" in log
    # A short output is kept verbatim (less its progress dots): the line is the fact.
    assert "src/cache.py:42:def refresh_entries(self):" in log and "| F. |" not in log
    assert "Ran `python -m pytest tests/test_cache.py -q`" in log
    date, observations = fmt.parse(log)
    assert date == lines[0] and len(observations) == len(lines) - 1


def test_extractive_log_fits_its_budget_keeping_the_user_first() -> None:
    messages = [msg(0, "user", "Decision: keep the public API stable.")]
    messages += [msg(i, "tool", f"ValueError: bad value {i}\n" + "x" * 2000) for i in range(1, 200)]
    log = extractive.distill(messages)
    assert fmt.estimate_tokens(log) <= fmt.budget_tokens(
        sum(fmt.estimate_tokens(m.content) for m in messages))
    assert "keep the public API stable" in log.splitlines()[1]


def test_merge_collapses_duplicates_and_keeps_the_first_date() -> None:
    a = "Date: Jan 2, 2026\n* 🔴 (10:00) User: x\n* 🟢 (10:01) Ran `ls`"
    b = "Date: Jan 3, 2026\n* 🔴 (10:00) User: x\n* 🟡 (11:00) Error: boom"
    merged = fmt.merge([a, b])
    assert merged.splitlines()[0] == "Date: Jan 2, 2026"
    assert merged.count("User: x") == 1 and "Error: boom" in merged


def test_consolidation_keeps_every_finding_before_any_minor_line() -> None:
    logs = [f"Date: Jan 2, 2026\n* 🟡 (10:{i:02d}) Error in `make`: E{i}Error at src/f{i}.c"
            + "".join(f"\n* 🟢 (10:{i:02d}) Ran `ls /tmp/dir{i}_{j}`" for j in range(6))
            for i in range(12)]
    merged = fmt.merge(logs, source_tokens=12 * 2_048)
    assert all(f"E{i}Error" in merged for i in range(12))
    assert fmt.estimate_tokens(merged) <= fmt.consolidation_budget(
        12 * 2_048, sum(fmt.estimate_tokens(log) for log in logs)) + 1


def test_consolidation_budget_is_proportional_to_what_it_merges() -> None:
    # A fixed share of the raw messages covered, whatever the number of logs merged.
    one = fmt.consolidation_budget(11_000, 10_000)
    assert one == 1_000
    assert fmt.consolidation_budget(10 * 11_000, 100_000) == 10 * one
    assert fmt.consolidation_budget(10 * 11_000, 500) == 500  # never grows


def test_fit_prefers_new_facts_to_a_name_said_again() -> None:
    same = [fmt.Observation(fmt.MEDIUM, "10:00", f"Ran into `reproduce.py` again ({i})")
            for i in range(10)]
    new = fmt.Observation(fmt.MEDIUM, "10:30", "Error: `TimeoutError` in `net/pool.py`")
    kept = fmt.fit([*same, new], budget_chars=3 * len(new.line()) + 3)
    assert new in kept and len(kept) <= 3


def test_source_refs_are_compact_recall_ids() -> None:
    assert fmt.source_refs([5, 3, 4, 9]) == "t:3–t:5, t:9"


def entry(eid: str, category: str, title: str, content: str, cross: bool = False) -> Entry:
    return Entry(eid, "t", "/p", category, title, content, 0.9, "", cross, 0.0, 0.0)


def test_lore_md_is_sorted_round_trips_and_leaves_cross_project_entries_out() -> None:
    entries = [entry("bbbbbbbb01", "pattern", "zeta helpers", "in util/"),
               entry("aaaaaaaa01", "decision", "Deploy branch", "tangerine\nnot main"),
               entry("cccccccc01", "pattern", "Alpha naming", "snake_case"),
               entry("dddddddd01", "preference", "terse replies", "yes", cross=True)]
    text = ex.render(entries)
    assert text.index("## Decision") < text.index("## Pattern")
    assert text.index("Alpha naming") < text.index("zeta helpers")
    assert "terse replies" not in text
    parsed = ex.parse(text)
    assert [(p.id, p.category, p.title) for p in parsed] == [
        ("aaaaaaaa01", "decision", "Deploy branch"), ("cccccccc01", "pattern", "Alpha naming"),
        ("bbbbbbbb01", "pattern", "zeta helpers")]
    assert parsed[0].content == "tangerine\nnot main"
    edited = text + "\n* **New rule**: added by hand\n"
    assert ex.parse(edited)[-1] == ex.FileEntry(None, "pattern", "New rule", "added by hand")


def test_pointer_section_is_replaced_in_place_and_nothing_else_changes() -> None:
    original = "# Rules\n\nBe kind.\n"
    once = ex.with_pointer(original)
    assert once.startswith(original) and once.count(ex.POINTER_BEGIN) == 1
    assert ex.with_pointer(once) == once
    edited = once.replace("Read it before", "READ IT before") + "\n## After\n"
    again = ex.with_pointer(edited)
    assert again.endswith("\n## After\n") and "READ IT" not in again


def test_titles_identify_entries() -> None:
    assert same_title("Deploy branch", "deploy  branch")
    assert same_title("release deploy branch name", "deploy branch name")
    assert not same_title("deploy branch", "test runner")


def test_side_channels_are_not_coding_turns() -> None:
    system = "x" * 500
    coding = {"system": system, "tools": [{"name": "t"}], "messages": []}
    assert is_coding_turn("anthropic", coding, {})
    assert not is_coding_turn("anthropic", {**coding, "tools": []}, {})
    assert not is_coding_turn("anthropic", {**coding, "system": "Write a title."}, {})
    assert not is_coding_turn("anthropic", {**coding, "stop_sequences": ["</block>"]}, {})
    assert not is_coding_turn("anthropic", coding, {"x-lore-worker": "distill"})
    codex = {"tools": [{"type": "function"}], "input": [
        {"role": "developer", "content": [{"type": "input_text", "text": system}]}]}
    assert is_coding_turn("responses", codex, {"x-codex-turn-metadata": '{"request_kind":"turn"}'})
    assert not is_coding_turn("responses", codex,
                              {"x-codex-turn-metadata": '{"request_kind":"title"}'})


def test_worker_requests_follow_each_family_rules() -> None:
    codex = wreq.build("codex", "gpt-5.1-codex-mini", "sys", "user", 500)
    assert codex["stream"] is True and "max_output_tokens" not in codex and codex["store"] is False
    assert wreq.build("responses", "m", "s", "u", 500)["max_output_tokens"] == 500
    reasoning = wreq.build("responses", "gpt-5-mini", "s", "u", 500)
    assert reasoning["max_output_tokens"] == 500 + wreq.REASONING_ALLOWANCE_TOKENS
    assert reasoning["reasoning"] == {"effort": "low"}
    anthropic = wreq.build("anthropic", "m", "s", "u", 500)
    assert anthropic["max_tokens"] == 500 and "cache_control" not in str(anthropic)
    sse = (b'event: response.completed\ndata: {"type":"response.completed","response":{"output":'
           b'[{"type":"message","content":[{"type":"output_text","text":"hi"}]}],"usage":'
           b'{"input_tokens":7,"output_tokens":2}}}\n\n')
    assert wreq.parse("codex", sse) == wreq.Answer("hi", 7, 2)
    body = b'{"content":[{"type":"text","text":"yo"}],"usage":{"input_tokens":3,"output_tokens":1}}'
    assert wreq.parse("anthropic", body) == wreq.Answer("yo", 3, 1)
