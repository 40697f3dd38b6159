"""What the extractive distiller keeps of what people and agents say, and of a
short output (``distill/prose.py``)."""

from __future__ import annotations

from lore_gateway.distill import extractive, prose
from lore_gateway.distill.extractive import SourceMessage
from lore_gateway.distill.format import HIGH, LOW, MEDIUM


def test_a_user_statement_is_kept_and_a_bare_go_ahead_is_not() -> None:
    said = prose.user_observation("Use SQLite for the cache, never Redis.", "09:00")
    assert said is not None and said.mark == HIGH and said.text.startswith("User: Use SQLite")
    assert prose.user_observation("continue", "09:01") is None
    assert prose.user_observation("ok go", "09:01") is None


def test_findings_are_kept_plans_are_minor_and_filler_is_dropped() -> None:
    text = ("THOUGHT: I will read `src/cache.py` next. The root cause is the stale key in "
            "`load_config`. This looks nice. It seems the `ttl` is 30 here.")
    found = list(prose.assistant_observations(text, "09:02", closing=False))
    assert [(o.mark, o.text) for o in found] == [
        (LOW, "I will read `src/cache.py` next."),
        (MEDIUM, "The root cause is the stale key in `load_config`."),
        (LOW, "It seems the `ttl` is 30 here.")]


def test_a_turns_closing_text_is_kept_whole() -> None:
    summary = ("Done. Committed 3f2a9c1 on branch fix/cache; PR #41 opened. Changed "
               "src/cache.py and tests/test_cache.py; 12 passed.")
    (closing,) = prose.assistant_observations(summary, "09:03", closing=True)
    assert closing.mark == MEDIUM and closing.text == "Said: " + summary


def test_an_edit_is_a_finding_with_its_command_and_a_listing_is_minor() -> None:
    edit = prose.command_observation("sed -i 's/ttl=30/ttl=300/' src/cache.py", "09:04")
    assert edit.mark == MEDIUM and "ttl=300" in edit.text
    assert prose.command_observation("ls -la src", "09:04").mark == LOW


def test_a_short_output_is_kept_whole_less_headers_progress_and_warnings() -> None:
    output = ("<returncode>0</returncode>\n<output>\n"
              "/t/basic.py:3: DeprecationWarning: Using or importing the ABCs\n"
              "  from collections import Mapping\n"
              "============================= test session starts ==============================\n"
              "tests/test_a.py ..F.                                                     [100%]\n"
              "f < x: True\nx > f raised TypeError: Invalid comparison\n</output>")
    kept = prose.short_output(output, "09:05", "python3 repro.py\nmore lines of a heredoc")
    assert kept is not None and kept.mark == MEDIUM
    assert kept.text == ("Output of `python3 repro.py`: f < x: True | "
                         "x > f raised TypeError: Invalid comparison")
    assert prose.short_output("\n".join(f"row_{i} = {i}" for i in range(40)), "09:05", "") \
        is None


def test_a_short_complaint_without_identifiers_is_kept() -> None:
    kept = prose.short_output("grep: Unmatched [, [^, [:, [., or [=", "09:06", "grep x")
    assert kept is not None and "Unmatched [" in kept.text
    assert prose.short_output("done", "09:06", "make") is None


def test_the_log_keeps_an_outputs_findings_and_the_output_itself() -> None:
    log = extractive.distill([
        SourceMessage(1, "assistant", "```bash\ngrep -n 'def reset' src/log.py\n```", 1.7e9),
        SourceMessage(2, "tool", "345:    def reset(self) -> None:", 1.7e9 + 1)],
        budget_tokens=1_000)
    assert "src/log.py:345:def reset(self) -> None:" in log  # the definition, placed
    assert "Output of `grep -n 'def reset' src/log.py`: 345:    def reset" in log
