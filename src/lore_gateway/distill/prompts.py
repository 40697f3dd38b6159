"""What the worker model is asked to do when it distills a segment (our wording)."""

from __future__ import annotations

from lore_gateway.distill import format as fmt
from lore_gateway.distill.extractive import SourceMessage, user_text

# Tool outputs are the bulk of a coding session; the observer sees the head and
# the tail of each (errors and summaries sit at the end), the store keeps it all.
TOOL_OUTPUT_HEAD_CHARS = 2_000
TOOL_OUTPUT_TAIL_CHARS = 2_000

OBSERVER_SYSTEM = """\
You keep the engineering log of a coding session. Write what happened as dated \
observations, one per line, not as a summary.

Answer with exactly one <observations> block and nothing else. Inside it: first \
the line "Date: <Mon D, YYYY>", then one line per observation in the form \
"* <mark> (HH:MM) <observation>", using the time of the message it comes from.

Marks:
🔴 what the user said: requests, statements, decisions, preferences. Keep every one.
🟡 what matters later: errors with their exact text, root causes, fixes and whether \
they worked, decisions with the alternative that was rejected and why, test results \
with their counts.
🟢 minor context: files read, commands run, dead ends.

Copy identifiers exactly as written: file paths, commands, error messages, commit \
SHAs, numbers, function and class names, configuration values. When something \
replaces an earlier state, say so ("X, replacing Y"). Early facts matter as much as \
late ones. Stay within {budget} tokens."""


def observer_prompt(segment: list[SourceMessage]) -> tuple[str, str, int]:
    """(system, user, max output tokens) for one segment."""
    n_in = sum(fmt.estimate_tokens(m.content) for m in segment)
    budget = fmt.budget_tokens(n_in)
    lines = [f"<segment date=\"{fmt.date_line(segment[0].created_at)[6:]}\">"]
    for message in segment:
        text = message.content
        if message.role == "tool":
            text = _clip(text)
        elif message.role == "user":
            text = user_text(text)
        if text:
            lines.append(f"[{fmt.clock(message.created_at)}] {message.role}: {text}")
    lines.append("</segment>")
    return OBSERVER_SYSTEM.format(budget=budget), "\n".join(lines), budget


def _clip(text: str) -> str:
    limit = TOOL_OUTPUT_HEAD_CHARS + TOOL_OUTPUT_TAIL_CHARS
    if len(text) <= limit:
        return text
    cut = len(text) - limit
    return (text[:TOOL_OUTPUT_HEAD_CHARS] + f"\n… [{cut} characters not shown] …\n"
            + text[-TOOL_OUTPUT_TAIL_CHARS:])


REFLECTOR_SYSTEM = """\
You condense several engineering logs of one coding session into one shorter log \
that keeps everything a later session could need.

Answer with exactly one <observations> block in the same format as the input: the \
earliest "Date: ..." line, then "* <mark> (HH:MM) <observation>" lines in time order. \
Merge duplicates into the most specific version. Drop values that a later observation \
replaced, and say what replaced them. Keep every 🔴 observation (the user's own \
words win over anything else on the same topic). Keep exact identifiers: paths, \
commands, errors, SHAs, numbers. Fixes from early in the session matter as much as \
late ones. Stay within {budget} tokens."""

# The fewest output tokens a consolidation call is allowed (a model needs room
# to write even a short log).
REFLECTOR_MIN_TOKENS = 1_024


def reflector_prompt(logs: list[str], source_tokens: int) -> tuple[str, str, int]:
    """(system, user, max output tokens) for merging ``logs`` (distilled from
    ``source_tokens`` of raw messages): the extractive merge's budget."""
    n_in = sum(fmt.estimate_tokens(text) for text in logs)
    budget = max(REFLECTOR_MIN_TOKENS, fmt.consolidation_budget(source_tokens, n_in))
    user = "\n\n".join(f"<log {i}>\n{text}\n</log {i}>" for i, text in enumerate(logs, 1))
    return REFLECTOR_SYSTEM.format(budget=budget), user, budget
