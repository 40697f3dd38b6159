"""``lore bench overhead --big-session``: decoding and preparing one very long request.

A Codex session of about 400K tokens (thousands of items: user turns, reasoning,
shell calls and their outputs, answers, one of our recall anchors) arrives
zstd-compressed, as Codex sends it. The gateway, started in this process with
its memory, knowledge and recall on, reads and decodes it, parses and checks it,
identifies the session, starts the pending turn, and runs the request pipeline
(anchor expansion, the context slot, knowledge, tool injection) down to the
bytes that go upstream: everything between the last byte received and the
upstream request. Each run is timed as a whole and step by step, and a ticker on
the event loop records the longest time the loop was held, since a prepare that
is fast on average but holds the loop for its whole length still stalls every
other stream. The reference gateway (TypeScript Lore) takes 178 ms from decode to
upstream on a comparable session.
"""

from __future__ import annotations

import asyncio
import json
import random
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import zstandard

from lore_gateway.recall.core.markers import anchor_text

# Characters per token of agent traffic (code, logs, prose), as Lore estimates it.
CHARS_PER_TOKEN = 4
PROJECT = "/home/dev/big-project"
SESSION = "0199a0c4-big-session-bench"
# Body chunks as a socket delivers them.
CHUNK = 64 * 1024

Progress = Callable[[str, int, int], None]


_WORDS = tuple(
    "def return self path config error value request session result import build test "
    "cache stream token class async await raise except yield lambda none true false "
    "item items index count limit offset buffer bytes chunk event frame parse write read "
    "open close start stop wait send recv retry timeout status header body json text "
    "user model tool call output input message content role system developer assistant "
    "src tests docs main branch commit merge diff patch file line column module package"
    .split())


def _filler(n: int, seed: int) -> str:
    """``n`` characters of code-like text (compresses about as well as real traffic)."""
    rng = random.Random(seed)
    out: list[str] = []
    size = 0
    while size < n:
        word = rng.choice(_WORDS) + (str(rng.randrange(1000)) if rng.random() < 0.3 else "")
        out.append(word)
        size += len(word) + 1
    return " ".join(out)[:n]


def session_items(tokens: int) -> tuple[list[dict[str, Any]], int]:
    """The items of a Codex session of about ``tokens`` tokens, and the index of
    the assistant item that carries a recall anchor."""
    items: list[dict[str, Any]] = [
        {"type": "message", "role": "developer", "content": [
            {"type": "input_text", "text": "<permissions instructions>\n" + _filler(2000, 1)}]},
        {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "# AGENTS.md instructions\n" + _filler(3000, 2)}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": (
            f"<environment_context>\n  <cwd>{PROJECT}</cwd>\n  <shell>bash</shell>\n"
            "</environment_context>")}]},
    ]
    budget = tokens * CHARS_PER_TOKEN
    size = sum(len(json.dumps(i)) for i in items)
    turn = 0
    while size < budget:
        call = f"call_{turn:06d}"
        turn_items: list[dict[str, Any]] = [
            {"type": "message", "role": "user", "content": [
                {"type": "input_text", "text": f"step {turn}: " + _filler(150, turn)}]},
            {"type": "reasoning", "id": f"rs_{turn:06d}", "summary": [],
             "encrypted_content": "gAAAAB" + _filler(400, turn + 3).replace(" ", "")},
            {"type": "function_call", "name": "shell", "call_id": call, "arguments": json.dumps(
                {"command": ["bash", "-lc", f"grep -rn {turn} src | head -40"]})},
            {"type": "function_call_output", "call_id": call, "output": _filler(500, turn + 5)},
            {"type": "message", "role": "assistant", "id": f"msg_{turn:06d}", "content": [
                {"type": "output_text", "text": _filler(300, turn + 11)}]},
        ]
        items.extend(turn_items)
        size += sum(len(json.dumps(i)) for i in turn_items)
        turn += 1
    anchor_at = len(items) // 2
    while items[anchor_at].get("role") != "assistant":
        anchor_at += 1
    return items, anchor_at


def request_body(items: list[dict[str, Any]]) -> dict[str, Any]:
    """A Codex CLI request around ``items`` (its fields and its tool list)."""
    schema = {"type": "object", "properties": {"command": {"type": "array",
                                                            "items": {"type": "string"}}}}
    return {
        "model": "gpt-5-codex", "instructions": _filler(12_000, 99), "input": items,
        "tools": [
            {"type": "function", "name": "shell", "description": _filler(600, 5),
             "strict": False, "parameters": schema},
            {"type": "function", "name": "update_plan", "description": _filler(300, 6),
             "strict": False, "parameters": {"type": "object", "properties": {}}},
            {"type": "custom", "name": "apply_patch", "description": _filler(900, 7),
             "format": {"type": "grammar", "syntax": "lark", "definition": _filler(800, 8)}},
        ],
        "tool_choice": "auto", "parallel_tool_calls": True,
        "reasoning": {"effort": "medium", "summary": "auto"}, "store": False, "stream": True,
        "include": ["reasoning.encrypted_content"], "prompt_cache_key": SESSION,
    }


def _stats(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {"p50_ms": ordered[len(ordered) // 2] * 1e3, "max_ms": ordered[-1] * 1e3}


class _LoopWatch:
    """The longest stretch the event loop went without running a 1 ms ticker."""

    def __init__(self) -> None:
        self.longest = 0.0
        self._task: asyncio.Task[None] | None = None

    async def _tick(self) -> None:
        last = time.perf_counter()
        while True:
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            self.longest = max(self.longest, now - last - 0.001)
            last = now

    def __enter__(self) -> _LoopWatch:
        self._task = asyncio.get_running_loop().create_task(self._tick())
        return self

    def __exit__(self, *_: object) -> None:
        assert self._task is not None
        self._task.cancel()


async def _measure(tokens: int, runs: int, data_dir: Path,
                   progress: Progress | None) -> dict[str, Any]:
    from lore_gateway.body import decode_body
    from lore_gateway.config import Settings
    from lore_gateway.exchange import parse_request
    from lore_gateway.headers import header_map
    from lore_gateway.knowledge import store as knowledge_store
    from lore_gateway.knowledge.sidechannel import is_coding_turn
    from lore_gateway.memory.store.anchor_store import StoredRecall
    from lore_gateway.recall.core.anchor_context import history_items, prefix_context_id
    from lore_gateway.routing import Family, match
    from lore_gateway.server import Gateway
    from lore_gateway.turns import TurnOutcome

    items, anchor_at = session_items(tokens)
    anchor_id = str(uuid.UUID("0e7c2a4d-9f1b-4c3a-8d2e-14b14b14b14b"))
    items[anchor_at] = {"type": "message", "role": "assistant",
                        "content": [{"type": "output_text", "text": anchor_text(anchor_id)}]}
    plain = orjson.dumps(request_body(items))
    body = zstandard.ZstdCompressor(level=3).compress(plain)
    headers = [(b"content-type", b"application/json"), (b"content-encoding", b"zstd"),
               (b"authorization", b"Bearer sk-bench-not-a-key"),
               (b"originator", b"codex_cli_rs"), (b"session-id", SESSION.encode()),
               (b"content-length", str(len(body)).encode())]
    route = match("POST", "/backend-api/codex/responses", "", anthropic_version=False,
                  upgrade=False)
    assert route is not None
    settings = Settings(data_dir=data_dir, port=0, upstream_chatgpt="http://127.0.0.1:9",
                        log_level="warning")
    gateway = Gateway(settings)
    await gateway.start()
    try:
        proxy = gateway.proxy
        assert proxy is not None and gateway.recall is not None
        pipeline = proxy.pipeline
        context = prefix_context_id(history_items({"input": items[:anchor_at]}, "input"))
        gateway.recall.replay.store.commit("personal", SESSION, [StoredRecall.from_messages(
            anchor_id=anchor_id, protocol="responses", marker=None, call_id="call_recall",
            arguments='{"query":"earlier decision"}', position=0, context_id=context,
            assistant={"type": "function_call", "call_id": "call_recall", "name": "recall",
                       "arguments": '{"query":"earlier decision"}'},
            tool_result={"type": "function_call_output", "call_id": "call_recall",
                         "output": _filler(2000, 3)})])
        await gateway.recall.replay.store.drain()
        conn = settings.database.connect()
        for n in range(12):
            knowledge_store.upsert(conn, tenant="personal", project=PROJECT,
                                   category="decision", title=f"decision {n} about the cache",
                                   content=_filler(200, n))
        conn.close()

        async def one() -> tuple[float, float, float, Any]:
            chunks = [body[i:i + CHUNK] for i in range(0, len(body), CHUNK)]

            async def receive() -> dict[str, Any]:
                chunk = chunks.pop(0)
                return {"type": "http.request", "body": chunk, "more_body": bool(chunks)}

            scope = {"type": "http", "method": "POST", "path": route.upstream_path,
                     "headers": headers}
            with _LoopWatch() as watch:
                start, cpu = time.perf_counter(), time.process_time()
                exchange, _ = await proxy.prepare(scope, receive, route)
                pending = proxy.turns.begin(exchange)
                elapsed = time.perf_counter() - start
                cpu = time.process_time() - cpu
                await asyncio.sleep(0.003)  # the ticker's last lap
            proxy.turns.end(pending, TurnOutcome(False), exchange.protocol)
            return elapsed, cpu, watch.longest, exchange

        totals: list[float] = []
        cpus: list[float] = []
        blocks: list[float] = []
        cold = 0.0
        exchange: Any = None
        for run in range(runs + 1):
            elapsed, cpu, longest, exchange = await one()
            if run == 0:
                cold = elapsed
            else:
                totals.append(elapsed)
                cpus.append(cpu)
                blocks.append(longest)
            if progress is not None:
                progress("prepare a big request", run + 1, runs + 1)
        expanded = b"call_recall" in exchange.upstream_body
        injected = b'"name":"recall"' in exchange.upstream_body
        knowledge = b"decision 0 about the cache" in exchange.upstream_body

        # The steps one by one (synchronous, for where the time goes).
        hmap = header_map(headers)
        steps: dict[str, list[float]] = {k: [] for k in (
            "decode zstd", "parse and check JSON", "identify (and coding turn?)",
            "pending turn (inputs)",
            "pipeline (anchors, context, knowledge, tool)", "upstream bytes")}
        for _ in range(runs):
            t0 = time.perf_counter()
            decoded = decode_body(body, "zstd", limit=settings.max_request_bytes)
            t1 = time.perf_counter()
            payload = parse_request(decoded, route.protocol)  # type: ignore[arg-type]
            t2 = time.perf_counter()
            ident = proxy.turns.identify(route, hmap, payload)
            coding = is_coding_turn(Family.RESPONSES, payload, hmap)
            t3 = time.perf_counter()
            assert ident is not None
            from lore_gateway.protocols import responses as responses_protocol

            responses_protocol.new_input_messages(payload)
            t4 = time.perf_counter()
            prepared = await pipeline.prepare(route, hmap, payload, ident, decoded,
                                              coding=coding)
            t5 = time.perf_counter()
            upstream = prepared.upstream_payload
            orjson.dumps(upstream if upstream is not None else payload)
            t6 = time.perf_counter()
            for name, seconds in zip(steps, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4,
                                             t6 - t5), strict=True):
                steps[name].append(seconds)
        return {
            "tokens": tokens, "items": len(items), "body_mb": len(plain) / 1e6,
            "compressed_mb": len(body) / 1e6, "runs": runs,
            "prepare_p50_ms": _stats(totals)["p50_ms"], "prepare_max_ms": _stats(totals)["max_ms"],
            "prepare_cold_ms": cold * 1e3,
            # CPU of the whole process meanwhile: moves less with machine load than wall time.
            "prepare_cpu_p50_ms": _stats(cpus)["p50_ms"],
            "loop_block_max_ms": max(blocks) * 1e3, "loop_block_p50_ms": _stats(blocks)["p50_ms"],
            "anchor_expanded": expanded, "recall_injected": injected,
            "knowledge_injected": knowledge,
            "steps": {name: _stats(values) for name, values in steps.items()},
        }
    finally:
        await gateway.stop()


def run(*, tokens: int = 400_000, runs: int = 15,
        progress: Progress | None = None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="lore-bench-") as tmp:
        return asyncio.run(_measure(tokens, runs, Path(tmp), progress))
