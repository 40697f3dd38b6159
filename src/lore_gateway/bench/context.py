"""``lore bench context``: one very long agent session through the gateway.

The coding sessions in ``shared/data/coding-sessions`` (read in place) are
replayed as **one** agent session, in Claude Code style (Anthropic Messages,
cache markers that switch from 5 minutes to 1 hour, thinking off, adaptive and
enabled) or Codex style (Responses, reasoning items with sealed encrypted
content); ``bench/context_clients.py`` builds the requests as those clients do.
The fake model answers each request with the recorded reply, so memory stores
what the model said, and every 15-40 replies (Claude) or 40-80 (Codex) it first
calls the hidden ``recall`` tool with a question about an earlier session. The
client resends its whole history every turn, as an agent does, through a real
gateway to the metered, strict fake upstream (input tokens = request bytes / 4,
bytes shared with the previous request = cache reads, every request checked
against the rules the real API enforces; ``testing/strict.py``).

Reported: upstream input tokens against plain passthrough (the client's own
body, which is what the gateway forwards without context management: computed
from the same bytes, not sent, since it passes the window), the peak upstream
request (recall follow-ups included) as a share of the window and how many
passed 0.75 and 0.80 of it, strict-rule violations, provider errors that
reached the client, the share of upstream requests that extend the previous one
byte for byte (history items compared one by one; ``cache_control`` markers
are not part of the cached bytes and are left out), rewrites by reason, worker
tokens, and how many facts of the first sessions (the set's questions and their
evidence strings) are still answerable at the end: in the last upstream request
itself or through a recall search of the session.
"""

from __future__ import annotations

import http.client
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from lore_gateway.bench.context_clients import STYLES, Client, Style, client_for, turns
from lore_gateway.bench.ingest import find_data
from lore_gateway.memory.store.records import Identity
from lore_gateway.obs import metrics
from lore_gateway.testing import (
    ANTHROPIC_KEY,
    OPENAI_KEY,
    BackgroundServer,
    FakeUpstream,
    gateway_settings,
)
from lore_gateway.testing.fake_metered import BYTES_PER_TOKEN

if TYPE_CHECKING:
    from lore_gateway.context.service import ContextService
    from lore_gateway.memory.service import Memory
    from lore_gateway.server import Gateway

DEFAULT_DATA = Path("../shared/data/coding-sessions/coding_eval.json")
PROJECT = "/bench/context"
WINDOW = 200_000
# Sessions whose questions are the "early facts" (the first ones replayed).
EARLY_SESSIONS = 3
SELF_CAUSED = ("budget", "emergency")
# Requests the fake keeps: enough for one turn's principal, follow-ups and the
# worker calls that may land meanwhile.
RECORDED = 32
# Shares of the window a request is counted against.
HIGH_SHARES = (0.75, 0.80)
Progress = Callable[[int, int], None]


def resolve_data_path(path: Path | None) -> Path:
    return find_data(path, DEFAULT_DATA, "coding sessions")


def run(path: Path, *, limit: int = 0, window: int = WINDOW, style: Style = "claude",
        progress: Progress | None = None) -> dict[str, Any]:
    if style not in STYLES:
        raise ValueError(f"unknown style {style!r}: one of {', '.join(STYLES)}")
    data = json.loads(path.read_text())
    sessions = data["sessions"][:limit] if limit else data["sessions"]
    plan = turns(sessions, data["questions"], style)
    early_ids = {s["session_id"] for s in sessions[:EARLY_SESSIONS]}
    early = [q for q in data["questions"] if q["session_id"] in early_ids]
    with tempfile.TemporaryDirectory(prefix="lore-bench-context-") as tmp, \
            BackgroundServer(FakeUpstream(max_recorded=RECORDED, metered=True,
                                          window=window)) as fake:
        from lore_gateway.server import Gateway

        settings = gateway_settings(
            fake, Path(tmp), worker=True, distill_idle_s=1e9, worker_max_attempts=1,
            distill_segment_tokens=16_384, worker_daily_tokens=10**9, export=False,
            context_window=window)
        with BackgroundServer(Gateway(settings)) as gw:
            memory, background = gw.memory, gw.background
            assert memory is not None and background is not None  # gateway_settings stores
            session = f"bench-context-{style}"
            figures = _drive(gw, memory, background.context, fake, client_for(style, len(plan)),
                             plan, session, window, progress)
            memory.flush(60)
            figures["style"] = style
            figures["early_facts"] = _early_facts(memory, fake, early, session)
    return figures


def _drive(gw: Gateway, memory: Memory, context: ContextService, fake: FakeUpstream,
           client: Client, plan: list[Any], session: str, window: int,
           progress: Progress | None) -> dict[str, Any]:
    before = _rewrite_counts()
    host, port = gw.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=300)
    headers = {"content-type": "application/json", "x-lore-session-id": session,
               "x-lore-project": PROJECT}
    if isinstance(client.path, str) and client.path.startswith("/v1/messages"):
        headers |= {"x-api-key": ANTHROPIC_KEY, "anthropic-version": "2023-06-01"}
    else:
        headers |= {"authorization": f"Bearer {OPENAI_KEY}", "originator": "codex_exec"}
    passthrough: list[int] = []
    previous: list[bytes] | None = None  # the last agent request's history items
    extends = requests = errors = recalls = 0
    started = time.perf_counter()
    for number, turn in enumerate(plan):
        body = client.request(number, turn)
        raw = orjson.dumps(body)
        passthrough.append(len(raw) // BYTES_PER_TOKEN)
        fake.script(client.scenarios(number, turn))
        mark = time.monotonic()
        conn.request("POST", client.path, raw, headers)
        resp = conn.getresponse()
        answer = resp.read()
        for request in _agent_requests(fake, mark):
            items = _items(request.json, client.key)
            extends += previous is not None and items[:len(previous)] == previous
            previous, requests = items, requests + 1
        recalls += turn.recall is not None
        if resp.status != 200:
            errors += 1
            client.received(number, turn, {})
        else:
            client.received(number, turn, orjson.loads(answer))
        if progress is not None:
            progress(number + 1, len(plan))
    conn.close()
    elapsed = time.perf_counter() - started
    log = [(tokens, cached) for tokens, cached in fake.metered_log]
    sizes = [tokens for tokens, _ in log]
    counts = {k: v - before.get(k, 0) for k, v in _rewrite_counts().items()
              if v - before.get(k, 0)}
    self_caused = sum(v for k, v in counts.items() if k.split("/")[0] in SELF_CAUSED)
    count = len(plan)
    worker = _worker_tokens(memory)
    state = context.current("personal", session)
    return {
        "turns": count,
        "upstream_requests": len(sizes),
        "hidden_recalls": recalls,
        "session_tokens": passthrough[-1],
        "window": window,
        "passthrough_input_tokens": sum(passthrough),
        "upstream_input_tokens": sum(sizes),
        "upstream_vs_passthrough": round(sum(sizes) / max(1, sum(passthrough)), 4),
        "cache_read_share": round(sum(c for _, c in log) / max(1, sum(sizes)), 4),
        "peak_request_tokens": max(sizes),
        "peak_share_of_window": round(max(sizes) / window, 4),
        "requests_over_share": {f"{share:.2f}": sum(1 for t in sizes if t > share * window)
                                for share in HIGH_SHARES},
        "passthrough_peak_share_of_window": round(max(passthrough) / window, 4),
        "strict_violations": len(fake.refusals),
        "violations_by_rule": _by_rule(fake),
        "provider_errors_to_client": errors,
        "extends_previous_share": round(extends / max(1, requests - 1), 4),
        "rewrites": counts,
        "self_caused_rewrites": self_caused,
        "prefix_rerenders": sum(v for k, v in counts.items() if k.endswith("rendered")),
        "self_caused_per_50_turns": round(50 * self_caused / max(1, count), 3),
        "final_layer": state.layer if state is not None else 0,
        "worker_tokens": worker,
        "worker_share_of_upstream": round(worker / max(1, sum(sizes)), 4),
        "client_compactions": 0,
        "per_turn": {"passthrough": passthrough[::10], "upstream": sizes[::10]},
        "elapsed_s": round(elapsed, 1),
    }


def _agent_requests(fake: FakeUpstream, since: float) -> list[Any]:
    """The agent's requests the fake received since ``since`` (workers' left out)."""
    return [r for r in fake.requests if r.received_at >= since
            and "x-lore-worker" not in r.headers and isinstance(r.json, dict)]


def _items(payload: Any, key: str) -> list[bytes]:
    """A request's history items as bytes, without ``cache_control`` markers
    (not part of the cached prefix: a client moves its marker every turn)."""
    items = payload.get(key) if isinstance(payload, dict) else None
    return [orjson.dumps(_unmarked(item)) for item in items or []]


def _unmarked(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _unmarked(v) for k, v in node.items() if k != "cache_control"}
    if isinstance(node, list):
        return [_unmarked(v) for v in node]
    return node


def _by_rule(fake: FakeUpstream) -> dict[str, int]:
    out: dict[str, int] = {}
    for _path, refusal in fake.refusals:
        out[refusal.rule] = out.get(refusal.rule, 0) + 1
    return out


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


def _worker_tokens(memory: Memory) -> int:
    row = memory.read(lambda c: c.execute(
        "SELECT coalesce(sum(tokens_in + tokens_out), 0) FROM worker_usage").fetchone())
    return int(row[0]) if row else 0


def _early_facts(memory: Memory, fake: FakeUpstream, early: list[dict[str, Any]],
                 session: str) -> dict[str, Any]:
    """Early questions whose evidence is in the last upstream request, or in a
    recall search of the session (top 10) for the question."""
    last = _last_agent_request(fake)
    context_text = _texts(last)
    identity = Identity(tenant="personal", project=PROJECT, session=session)
    in_context = in_recall = 0
    for question in early:
        evidence = str(question["evidence"])
        if evidence in context_text:
            in_context += 1
            continue
        result = memory.search_sync(question["question"], identity=identity,
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
