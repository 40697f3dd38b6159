"""``lore bench footprint``: the serving gateway's resident memory, process by process."""

from __future__ import annotations

import typer

from lore_gateway.cli import output
from lore_gateway.cli.main import bench_app


@bench_app.command("footprint")
def footprint(
    turns: int = typer.Option(1000, "--turns", min=1, help="Turns stored before measuring."),
    recall_every: int = typer.Option(10, "--recall-every", min=0,
                                     help="One turn in this many calls recall (0: none)."),
    embeddings: bool = typer.Option(True, "--embeddings/--no-embeddings",
                                    help="Run the gateway with the embedding model."),
    settle: float = typer.Option(300.0, "--settle", min=0,
                                 help="Seconds to wait for the embedder to catch up."),
    as_json: bool = typer.Option(False, "--json", help="Also print the figures as one JSON "
                                 "object on the last line of stdout."),
) -> None:
    """Run `lore serve` against the fake upstream, store TURNS turns through it, wait
    for the embedder, and print RSS, PSS and peak RSS of the gateway and each of its
    helper processes (embedder, storage, any search workers) and their totals."""
    from lore_gateway.bench.footprint import run

    result = run(turns=turns, recall_every=recall_every, embeddings=embeddings,
                 settle=settle)
    rows = []
    for phase in ("idle", "after"):
        tree = result[phase]
        for p in tree["processes"]:
            rows.append((phase, p["name"], str(p["pid"]), f"{p['rss_mib']:.1f}",
                         f"{p['pss_mib']:.1f}", f"{p['peak_rss_mib']:.1f}"))
        rows.append((phase, "total", "", f"{tree['rss_mib']:.1f}", f"{tree['pss_mib']:.1f}",
                     ""))
    output.print_table(
        [output.Column(c, "right", False) for c in
         ("phase", "process", "pid", "RSS MiB", "PSS MiB", "peak RSS MiB")], rows)
    cfg = result["config"]
    output.line(f"{result['stored_turns']} turns stored ({result['failed']} failed) in "
                f"{result['store_s']:g} s; {result['embedded']} of {result['messages']} "
                f"messages embedded; load average {cfg['loadavg']:.1f} on {cfg['cpus']} CPUs")
    if as_json:
        output.print_json(result)
