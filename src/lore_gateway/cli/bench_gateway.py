"""``lore bench overhead``: the gateway's added latency, throughput and CPU cost,
against a bare relay measured in the same run."""

from __future__ import annotations

import json
from typing import Any

import typer

from lore_gateway.cli import output
from lore_gateway.cli.main import bench_app


def _names(text: str, allowed: tuple[str, ...], option: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in allowed]
    if unknown or not names:
        raise output.UserError(f"{option} takes a comma-separated list of "
                               f"{', '.join(allowed)}; got {text!r}")
    return names


@bench_app.command("overhead")
def overhead(
    as_json: bool = typer.Option(False, "--json", help="Also print the figures as one JSON "
                                 "object on the last line of stdout."),
    requests: int = typer.Option(300, "--requests",
                                 help="Requests per target and workload at concurrency 1."),
    requests_c16: int = typer.Option(3000, "--requests-c16",
                                     help="Requests per target and workload at concurrency "
                                          "16 (thirty rounds of 100: a short run's ratios "
                                          "scatter on a small machine)."),
    events: int = typer.Option(41, "--events", help="SSE events per streamed Responses answer."),
    store: bool = typer.Option(True, "--store/--no-store",
                               help="Store turns in memory (and offer recall), as a real "
                                    "gateway does."),
    protocols: str = typer.Option("responses,chat,anthropic,gemini", "--protocols",
                                  help="Which protocols to measure."),
    shapes: str = typer.Option("plain,tool", "--shapes",
                               help="plain: no tools; tool: one client tool (the gateway "
                                    "injects recall and watches the stream)."),
    concurrency: str = typer.Option("1,16", "--concurrency",
                                    help="Which phases to run: 1, 16 or both."),
    big_mb: int = typer.Option(50, "--big-mb",
                               help="Also stream a response of this many MB through the "
                                    "gateway and report its peak RSS growth (0: skip)."),
    big_session: bool = typer.Option(False, "--big-session",
                                     help="Only this: time decoding and preparing a "
                                          "400K-token Codex request in the gateway's "
                                          "request pipeline."),
    session_tokens: int = typer.Option(400_000, "--session-tokens",
                                       help="Size of the --big-session request, in tokens."),
    watched_mb: float = typer.Option(0, "--watched-mb",
                                     help="Only this: stream an Anthropic answer of this many "
                                          "MiB through the gateway, recall-watched and plain, "
                                          "alternating, and print the time ratio."),
    watched_delta: int = typer.Option(16, "--watched-delta",
                                      help="Bytes of text per delta for --watched-mb."),
    watched_repeats: int = typer.Option(5, "--watched-repeats",
                                        help="Runs per path for --watched-mb (medians)."),
) -> None:
    """Stream identical requests to a fake upstream directly, through a bare aiohttp
    relay and through the gateway, interleaved, for Responses, Chat, Anthropic and Gemini,
    plain and with one client tool, at concurrency 1 and 16; print per target
    requests/s, latency p50/p99, the added milliseconds, CPU per request and peak
    RSS, and the gateway against the relay as a difference and a ratio."""
    from lore_gateway.bench import overhead as bench

    if big_session:
        _print_big_session(session_tokens, as_json)
        return
    if watched_mb:
        w = bench.run_watched(megabytes=watched_mb, delta_bytes=watched_delta,
                              repeats=watched_repeats)
        output.line(f"watched stream: {w['megabytes']:g} MiB in {w['delta_bytes']}-byte "
                    f"deltas (median of {w['repeats']}): plain {w['plain_s']:.2f} s, "
                    f"recall-watched {w['watched_s']:.2f} s, ratio {w['ratio']:.2f}x")
        if as_json:
            output.print_json(w)
        return
    phases = tuple(int(c) for c in _names(concurrency, ("1", "16"), "--concurrency"))
    with output.stages() as update:
        result = bench.run(requests_c1=requests, requests_c16=requests_c16, events=events,
                           store=store, protocols=_names(protocols, bench.PROTOCOLS,
                                                         "--protocols"),
                           shapes=_names(shapes, bench.SHAPES, "--shapes"),
                           concurrencies=phases, big_mb=big_mb, progress=update)
    _print(result, store)
    if as_json:
        print(json.dumps(result, separators=(",", ":")))


def _f(value: float | None, spec: str, unit: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{unit}"


def _print_cpu_parts(result: dict[str, Any]) -> None:
    """The gateway's CPU per request split by process: its own interpreter
    (``main``) and each child (``lore-store``, ``lore-embed``), the background
    work that landed during the run included."""
    parts = [(phase, name, figures["gateway"].get("cpu_ms_per_request_by_process", {}))
             for phase in ("c1", "c16") for name, figures in result.get(phase, {}).items()
             if "gateway" in figures]
    names = sorted({p for _, _, by in parts for p in by}, key=lambda p: (p != "main", p))
    if not names:
        return
    output.print_table(
        [output.Column(c, "right", False) for c in ("phase", "workload", *names)],
        [(phase.replace("c", "c="), name, *(_f(by.get(p), ".2f") for p in names))
         for phase, name, by in parts],
        title="gateway CPU ms per request, by process")


def _print(result: dict[str, Any], store: bool) -> None:
    rows: list[tuple[str, ...]] = []
    for phase in ("c1", "c16"):
        for name, figures in result.get(phase, {}).items():
            for target in ("direct", "relay", "gateway"):
                s = figures.get(target)
                if s is None:
                    continue
                rows.append((phase.replace("c", "c="), name, target, f"{s['rps']:.0f}",
                             f"{s['total_p50_ms']:.2f}", f"{s['total_p99_ms']:.2f}",
                             _f(s.get("added_p50_ms"), "+.2f"), _f(s.get("added_p99_ms"), "+.2f"),
                             _f(s.get("cpu_ms_per_request"), ".2f")))
    output.print_table(
        [output.Column(c, "right", False) for c in
         ("phase", "workload", "target", "req/s", "p50 ms", "p99 ms", "added p50",
          "added p99", "CPU ms/req")],
        rows, title=f"lore bench overhead ({result['config']['events']} SSE events, "
                    f"store={'on' if store else 'off'})")
    rows = []
    for phase in ("c1", "c16"):
        for name, figures in result.get(phase, {}).items():
            v = figures.get("gateway_vs_relay")
            if v is not None:
                rows.append((phase.replace("c", "c="), name,
                             _f(v["added_p50_diff_ms"], "+.2f", " ms"),
                             _f(v["added_p50_ratio"], ".2f", "x"),
                             _f(v["added_p99_diff_ms"], "+.2f", " ms"),
                             _f(v["rps_ratio"], ".2f", "x"), _f(v["cpu_ms_diff"], "+.2f", " ms"),
                             _f(v["cpu_ratio"], ".2f", "x")))
    output.print_table(
        [output.Column(c, "right", False) for c in
         ("phase", "workload", "added p50 diff", "ratio", "added p99 diff", "req/s ratio",
          "CPU diff", "CPU ratio")],
        rows, title="gateway against the relay")
    _print_cpu_parts(result)
    for name, m in result.get("memory", {}).items():
        output.line(f"{name}: peak RSS {m['peak_rss_mb']:.0f} MB (with its "
                    f"{m['processes'] - 1} child processes {m['tree_peak_rss_mb']:.0f} MB)")
    if "big_stream" in result:
        b = result["big_stream"]
        output.line(f"big stream: {b['megabytes_received']:.1f} MB in {b['seconds']:.2f} s, "
                    f"gateway peak RSS grew {b['peak_rss_growth_mb']:.1f} MB")
    for check in result.get("targets", []):
        output.line(f"{'met    ' if check['met'] else 'NOT met'}  {check['check']}: "
                    f"{check['value']:.2f} {check['unit']} (target {check['limit']})")


def _print_big_session(tokens: int, as_json: bool) -> None:
    from lore_gateway.bench import big_session

    with output.stages() as update:
        result = big_session.run(tokens=tokens, progress=update)
    output.print_table(
        [output.Column(c, "right", False) for c in ("step", "p50 ms", "max ms")],
        [(step, f"{t['p50_ms']:.1f}", f"{t['max_ms']:.1f}")
         for step, t in result["steps"].items()],
        title=f"lore bench overhead --big-session ({result['body_mb']:.1f} MB, "
              f"{result['items']} items, ~{result['tokens']:,} tokens)")
    output.line(f"prepared (decode to upstream bytes) p50 {result['prepare_p50_ms']:.1f} ms "
                f"(CPU {result['prepare_cpu_p50_ms']:.1f} ms); "
                f"longest the event loop was held {result['loop_block_max_ms']:.1f} ms")
    if as_json:
        print(json.dumps(result, separators=(",", ":")))
