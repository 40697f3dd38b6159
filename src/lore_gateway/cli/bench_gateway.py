"""``lore bench overhead``: the gateway's added latency and throughput cost."""

from __future__ import annotations

import json

import typer

from lore_gateway.cli import output
from lore_gateway.cli.main import bench_app


@bench_app.command("overhead")
def overhead(
    as_json: bool = typer.Option(False, "--json", help="Also print the figures as one JSON "
                                 "object on the last line of stdout."),
    requests: int = typer.Option(300, "--requests", help="Requests per path at concurrency 1."),
    requests_c16: int = typer.Option(600, "--requests-c16",
                                     help="Requests per path at concurrency 16."),
    events: int = typer.Option(41, "--events", help="SSE events per streamed response."),
    store: bool = typer.Option(True, "--store/--no-store",
                               help="Store turns in memory, as a real gateway does."),
    recall_tool: bool = typer.Option(False, "--recall-tool",
                                     help="Inject the recall tool (never called)."),
    big_mb: int = typer.Option(50, "--big-mb",
                               help="Also stream a response of this many MB through the "
                                    "gateway and report its peak RSS growth (0: skip)."),
    watched_mb: float = typer.Option(0, "--watched-mb",
                                     help="Only this: stream an Anthropic answer of this many "
                                          "MiB through the gateway, recall-watched and plain, "
                                          "alternating, and print the time ratio."),
    watched_delta: int = typer.Option(16, "--watched-delta",
                                      help="Bytes of text per delta for --watched-mb."),
    watched_repeats: int = typer.Option(5, "--watched-repeats",
                                        help="Runs per path for --watched-mb (medians)."),
) -> None:
    """Stream identical Responses requests to a fake upstream directly and through the
    gateway, alternating, at concurrency 1 and 16; print requests/s, TTFB and total
    latency p50/p99 per path, the added milliseconds and the gateway/direct ratios."""
    from lore_gateway.bench.overhead import run, run_watched

    if watched_mb:
        w = run_watched(megabytes=watched_mb, delta_bytes=watched_delta,
                        repeats=watched_repeats)
        output.line(f"watched stream: {w['megabytes']:g} MiB in {w['delta_bytes']}-byte "
                    f"deltas (median of {w['repeats']}): plain {w['plain_s']:.2f} s, "
                    f"recall-watched {w['watched_s']:.2f} s, ratio {w['ratio']:.2f}x")
        if as_json:
            output.print_json(w)
        return
    with output.stages() as update:
        result = run(requests_c1=requests, requests_c16=requests_c16, events=events,
                     store=store, recall_tool=recall_tool, big_mb=big_mb, progress=update)
    output.print_table(
        [output.Column(c, "right", False) for c in
         ("phase", "path", "req/s", "TTFB p50", "TTFB p99", "total p50", "total p99")],
        [(phase, path, f"{s['rps']:.0f}", f"{s['ttfb_p50_ms']:.2f} ms",
          f"{s['ttfb_p99_ms']:.2f} ms", f"{s['total_p50_ms']:.2f} ms",
          f"{s['total_p99_ms']:.2f} ms")
         for phase in ("c1", "c16") for path in ("direct", "gateway")
         for s in (result[phase][path],)],
        title=f"lore bench overhead ({events} SSE events per response, "
              f"store={'on' if store else 'off'}, recall tool={'on' if recall_tool else 'off'})")
    c1, c16 = result["c1"], result["c16"]
    output.line(f"c=1 : added p50 {c1['added_p50_ms']:+.2f} ms, p99 {c1['added_p99_ms']:+.2f} ms"
                  f", TTFB p50 {c1['added_ttfb_p50_ms']:+.2f} ms;"
                  f" throughput {c1['throughput_ratio']:.2f}x direct")
    output.line(f"c=16: added p50 {c16['added_p50_ms']:+.2f} ms;"
                  f" throughput {c16['throughput_ratio']:.2f}x direct")
    if "big_stream" in result:
        b = result["big_stream"]
        output.line(f"big stream: {b['megabytes_received']:.1f} MB in {b['seconds']:.2f} s, "
                      f"gateway peak RSS grew {b['peak_rss_growth_mb']:.1f} MB")
    if as_json:
        print(json.dumps(result, separators=(",", ":")))
