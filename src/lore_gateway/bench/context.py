"""``lore bench context``: one very long agent session through the gateway.

The coding sessions in ``shared/data/coding-sessions`` (read in place) are
concatenated into one Anthropic agent session: each task is a user message,
each recorded model reply becomes an assistant turn with a ``bash`` tool call,
each shell output its tool result. The fake model answers each request with
the recorded reply (so memory stores what the model said). The driver resends the whole history for
every assistant turn, as an agent does, through a real gateway to the metered
fake upstream (input tokens = request bytes / 4, bytes shared with the previous
request = cache reads; ``testing/fake_upstream.py``).

Reported: upstream input tokens per turn against plain passthrough (the
client's own body, which is what the gateway forwards without context
management: computed from the same bytes, not sent, since it passes the window),
peak request size as a share of the window, the share of turns whose request
extends the previous one byte for byte (the received bodies' history items
compared one by one), rewrites by reason, worker tokens, and how many facts of
the first sessions (the set's questions, their evidence strings) are still
answerable at the end: in the last upstream request itself or through a recall
search of the session.
"""

from __future__ import annotations

import http.client
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from lore_gateway.bench.ingest import find_data
from lore_gateway.memory.records import Identity
from lore_gateway.obs import metrics
from lore_gateway.testing import ANTHROPIC_KEY, BackgroundServer, FakeUpstream, gateway_settings
from lore_gateway.testing.fake_metered import BYTES_PER_TOKEN

DEFAULT_DATA = Path("../shared/data/coding-sessions/coding_eval.json")
SESSION = "bench-context-long-session"
PROJECT = "/bench/context"
MODEL = "claude-sonnet-4-5"
WINDOW = 200_000
# Sessions whose questions are the "early facts" (the first ones replayed).
EARLY_SESSIONS = 3
SYSTEM = ("You are a coding agent working in a git repository through a bash tool. Read "
          "files before editing them, run the tests after every change, keep diffs small, "
          "and explain what you changed and why. ") * 4
TOOLS = [{"name": "bash", "description": "Run one bash command in the repository.",
          "input_schema": {"type": "object", "properties": {"command": {"type": "string"}},
                           "required": ["command"]}}]
SELF_CAUSED = ("budget", "emergency")
# Requests the fake keeps: enough to find the last agent request among worker calls.
RECORDED = 16
Progress = Callable[[int, int], None]


def resolve_data_path(path: Path | None) -> Path:
    return find_data(path, DEFAULT_DATA, "coding sessions")


def build(data: dict[str, Any], limit: int = 0) -> tuple[list[dict[str, Any]], list[int],
                                                        list[dict[str, Any]]]:
    """The whole history, the index at which each request is sent, and the
    early questions."""
    sessions = data["sessions"][:limit] if limit else data["sessions"]
    history: list[dict[str, Any]] = []
    sends: list[int] = []
    calls = 0
    for session in sessions:
        pending: str | None = None
        for message in session["messages"]:
            role, content = message["role"], str(message["content"])
            if role == "user":
                if history and history[-1]["role"] == "user":
                    history.append({"role": "assistant", "content": [
                        {"type": "text", "text": "Done with that task."}]})
                history.append({"role": "user", "content": [{"type": "text", "text": content}]})
                sends.append(len(history))
            elif role == "assistant":
                if pending is not None:  # a reply with no recorded output
                    history.append({"role": "user", "content": [
                        {"type": "tool_result", "tool_use_id": pending,
                         "content": "(no output)"}]})
                    sends.append(len(history))
                calls += 1
                pending = f"toolu_{calls:06d}"
                history.append({"role": "assistant", "content": [
                    {"type": "text", "text": content},
                    {"type": "tool_use", "id": pending, "name": "bash",
                     "input": {"command": _command(content)}}]})
            elif role == "tool" and pending is not None:
                history.append({"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": pending, "content": content}]})
                pending = None
                sends.append(len(history))
        if history[-1]["role"] == "assistant" and pending is not None:
            history.append({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": pending, "content": "(no output)"}]})
    early_ids = {s["session_id"] for s in sessions[:EARLY_SESSIONS]}
    early = [q for q in data["questions"] if q["session_id"] in early_ids]
    return history, sorted(set(sends)), early


def _command(text: str) -> str:
    start = text.find("```bash")
    if start < 0:
        return "true"
    end = text.find("```", start + 7)
    return text[start + 7:end].strip() if end > 0 else text[start + 7:].strip()


def run(path: Path, *, limit: int = 0, window: int = WINDOW,
        progress: Progress | None = None) -> dict[str, Any]:
    data = json.loads(path.read_text())
    history, sends, early = build(data, limit)
    with tempfile.TemporaryDirectory(prefix="lore-bench-context-") as tmp, \
            BackgroundServer(FakeUpstream(max_recorded=RECORDED, metered=True)) as fake:
        from lore_gateway.server import Gateway

        settings = gateway_settings(
            fake, Path(tmp), worker=True, distill_idle_s=1e9, worker_max_attempts=1,
            distill_segment_tokens=16_384, worker_daily_tokens=10**9, export=False,
            context_window=window)
        with BackgroundServer(Gateway(settings)) as gw:
            figures = _drive(gw, fake, history, sends, window, progress)
            gw.memory.flush(60)
            figures["early_facts"] = _early_facts(gw, fake, early)
    return figures


def _drive(gw: Any, fake: FakeUpstream, history: list[dict[str, Any]], sends: list[int],
           window: int, progress: Progress | None) -> dict[str, Any]:
    before = _rewrite_counts()
    host, port = gw.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=300)
    headers = {"content-type": "application/json", "x-api-key": ANTHROPIC_KEY,
               "anthropic-version": "2023-06-01", "x-lore-session-id": SESSION,
               "x-lore-project": PROJECT}
    passthrough: list[int] = []
    previous: list[bytes] = []
    extends = 0
    started = time.perf_counter()
    for number, end in enumerate(sends):
        body = orjson.dumps({"model": MODEL, "max_tokens": 1024, "system": SYSTEM,
                             "tools": TOOLS, "messages": history[:end]})
        passthrough.append(len(body) // BYTES_PER_TOKEN)
        # The fake model answers with the recorded reply, so memory stores what
        # the agent's model said (the client appends the same reply).
        reply = history[end] if end < len(history) else None
        if reply is not None and reply["role"] == "assistant":
            fake.script([f"text:{reply['content'][0]['text']}"])
        conn.request("POST", "/v1/messages", body, headers)
        resp = conn.getresponse()
        answer = resp.read()
        if resp.status != 200:
            raise RuntimeError(f"turn {number}: the gateway answered {resp.status}: "
                               f"{answer[:300]!r}")
        received = _last_agent_request(fake)
        items = [orjson.dumps(m) for m in received["messages"]]
        if number and items[:len(previous)] == previous:
            extends += 1
        previous = items
        if progress is not None:
            progress(number + 1, len(sends))
    conn.close()
    elapsed = time.perf_counter() - started
    upstream = [tokens for tokens, _ in fake.metered_log]
    cached = [c for _, c in fake.metered_log]
    counts = {k: v - before.get(k, 0) for k, v in _rewrite_counts().items()
              if v - before.get(k, 0)}
    self_caused = sum(v for k, v in counts.items() if k.split("/")[0] in SELF_CAUSED)
    turns = len(sends)
    worker = _worker_tokens(gw)
    state = gw.background.context.current("personal", SESSION)
    return {
        "turns": turns,
        "session_tokens": passthrough[-1],
        "window": window,
        "passthrough_input_tokens": sum(passthrough),
        "upstream_input_tokens": sum(upstream),
        "upstream_vs_passthrough": round(sum(upstream) / max(1, sum(passthrough)), 4),
        "cache_read_share": round(sum(cached) / max(1, sum(upstream)), 4),
        "peak_request_tokens": max(upstream),
        "peak_share_of_window": round(max(upstream) / window, 4),
        "passthrough_peak_share_of_window": round(max(passthrough) / window, 4),
        "extends_previous_share": round(extends / max(1, turns - 1), 4),
        "rewrites": counts,
        "self_caused_rewrites": self_caused,
        "prefix_rerenders": sum(v for k, v in counts.items() if k.endswith("rendered")),
        "self_caused_per_50_turns": round(50 * self_caused / max(1, turns), 3),
        "final_layer": state.layer if state is not None else 0,
        "worker_tokens": worker,
        "worker_share_of_upstream": round(worker / max(1, sum(upstream)), 4),
        "client_compactions": 0,
        "per_turn": {"passthrough": passthrough[::10], "upstream": upstream[::10]},
        "elapsed_s": round(elapsed, 1),
    }


def _last_agent_request(fake: FakeUpstream) -> Any:
    return next(r.json for r in reversed(fake.requests) if "x-lore-worker" not in r.headers)


def _rewrite_counts() -> dict[str, float]:
    out: dict[str, float] = {}
    for family in metrics.context_rewrites_total.collect():
        for sample in family.samples:
            if sample.name.endswith("_total"):
                key = f"{sample.labels['reason']}/prefix {sample.labels['prefix']}"
                out[key] = sample.value
    return out


def _worker_tokens(gw: Any) -> int:
    row = gw.memory.read(lambda c: c.execute(
        "SELECT coalesce(sum(tokens_in + tokens_out), 0) FROM worker_usage").fetchone())
    return int(row[0]) if row else 0


def _early_facts(gw: Any, fake: FakeUpstream, early: list[dict[str, Any]]) -> dict[str, Any]:
    """Early questions whose evidence is in the last upstream request, or in a
    recall search of the session (top 10) for the question."""
    last = _last_agent_request(fake)
    context_text = _texts(last)
    identity = Identity(tenant="personal", project=PROJECT, session=SESSION)
    in_context = in_recall = 0
    for question in early:
        evidence = str(question["evidence"])
        if evidence in context_text:
            in_context += 1
            continue
        result = gw.memory.search_sync(question["question"], identity=identity,
                                       scope="session", limit=10)
        if any(evidence in hit.content for hit in result.hits):
            in_recall += 1
    total = len(early)
    return {"questions": total, "in_context": in_context, "via_recall": in_recall,
            "answerable": in_context + in_recall,
            "share": round((in_context + in_recall) / max(1, total), 4)}


def _texts(payload: Any) -> str:
    """Every string in a request, joined (the evidence may sit in any block)."""
    out: list[str] = []
    stack = [payload]
    while stack:
        node = stack.pop()
        if isinstance(node, str):
            out.append(node)
        elif isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return "\n".join(out)
