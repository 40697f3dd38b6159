"""``lore bench soak`` and ``lore bench fuzz``: the reliability campaign."""

from __future__ import annotations

import json

import typer
from rich.console import Console
from rich.table import Table

from lore_gateway.cli.main import bench_app


@bench_app.command("soak")
def soak(
    clients: int = typer.Option(200, "--clients", min=1, help="Concurrent clients."),
    seconds: float = typer.Option(60.0, "--seconds", min=1, help="How long the load runs."),
    recall_share: float = typer.Option(0.5, "--recall-share", min=0, max=1,
                                       help="Share of clients whose turns call recall."),
    embeddings: bool = typer.Option(True, "--embeddings/--no-embeddings",
                                    help="Run the gateway with the embedding model."),
    grace: float = typer.Option(10.0, "--grace", help="LORE_SHUTDOWN_GRACE of the gateway."),
    kill: bool = typer.Option(False, "--kill", help="SIGKILL the gateway half-way instead of "
                              "SIGTERM at the end; restart it and count the turns lost."),
    as_json: bool = typer.Option(False, "--json", help="Also print the figures as one JSON "
                                 "object on the last line of stdout."),
) -> None:
    """Drive CLIENTS agents (half of them recall) through a gateway for SECONDS; print
    errors, fd leaks, latency by kind, RSS over time, turns stored against completed
    and the SIGTERM exit time."""
    from lore_gateway.bench.soak import run

    result = run(clients=clients, seconds=seconds, recall_share=recall_share,
                 embeddings=embeddings, grace=grace, kill=kill)
    console = Console()
    table = Table(title=f"lore bench soak ({clients} clients, {seconds:g} s, "
                        f"{result['config']['recall_clients']} recall)")
    for column in ("kind", "completed", "errors", "without memory", "p50", "p99", "max"):
        table.add_column(column, justify="right")
    for kind in ("text", "recall"):
        s = result[kind]
        table.add_row(kind, str(s["completed"]), str(s["errors"]), str(s["without_memory"]),
                      f"{s['p50_ms']:.0f} ms",
                      f"{s['p99_ms']:.0f} ms", f"{s['max_ms']:.0f} ms")
    console.print(table)
    ratio = result["recall_over_text"]
    typer.echo(f"recall / text: p50 x{ratio['p50']:.2f}, p99 x{ratio['p99']:.2f}")
    rss = ", ".join(f"{t:.0f}s {mb:.0f}" for t, mb in result["rss_mb"])
    typer.echo(f"gateway RSS (MB): {rss}")
    if "rss_growth_after_half" in result:
        typer.echo(f"RSS growth over the second half: {result['rss_growth_after_half']:.1%}")
    if "rss_growth_after_first_minute" in result:
        typer.echo("RSS growth after the first minute: "
                   f"{result['rss_growth_after_first_minute']:.1%}")
    if "fd_leak" in result:
        typer.echo(f"open fds after the load minus before: {result['fd_leak']}")
    typer.echo(f"largest write queue seen: {result['write_queue_max']} turns; gateway log: "
               f"{result['log_errors']} errors, {result['database_locked']} 'locked'")
    typer.echo(f"turns completed {result['completed']}, stored {result['stored']}, "
               f"lost {result['lost_turns']}; integrity {result['integrity']}")
    typer.echo(f"SIGTERM exit {result['shutdown_s']} s (exit code {result['exit_code']}, "
               f"grace {grace:g} s)")
    cpu, lag = result["cpu_cores"], result["client_lag_ms"]
    typer.echo(f"CPU during the load (cores): gateway {cpu['gateway']:.2f}, its search and "
               f"embedding processes {cpu['gateway_children']:.2f}, fake upstream "
               f"{cpu['fake_upstream']:.2f}, this client {cpu['client']:.2f}; client loop "
               f"lag p50 {lag['p50']:.0f} ms, p99 {lag['p99']:.0f} ms")
    typer.echo(f"load average {result['config']['loadavg_before']:.1f} before, "
               f"{result['config']['loadavg']:.1f} after the load, on "
               f"{result['config']['cpus']} CPUs")
    if as_json:
        typer.echo(json.dumps(result))


@bench_app.command("fuzz")
def fuzz(
    client_cases: int = typer.Option(20_000, "--client-cases", min=0,
                                     help="Fuzzed client requests (every route)."),
    upstream_cases: int = typer.Option(20_000, "--upstream-cases", min=0,
                                       help="Fuzzed upstream streams (plain and recall mode)."),
    seed: int = typer.Option(None, "--seed", help="Hypothesis seed (default: random)."),
    as_json: bool = typer.Option(False, "--json", help="Also print the figures as one JSON "
                                 "object on the last line of stdout."),
) -> None:
    """Run the fuzz campaign of the test suite with fresh random cases: request bodies
    and headers on every route, and malformed upstream streams. Exit code 1 when a
    case breaks the gateway (the shrunk case is printed)."""
    try:
        from lore_gateway.bench.fuzz import run
        result = run(client_cases=client_cases, upstream_cases=upstream_cases, seed=seed)
    except ImportError as exc:
        typer.echo(f"lore bench fuzz needs the dev extra: pip install -e '.[dev]' ({exc})",
                   err=True)
        raise typer.Exit(2) from exc
    for name, figures in result["targets"].items():
        typer.echo(f"{name}: {figures['cases']} cases in {figures['seconds']} s")
    typer.echo(f"statuses: {result['statuses']}; cut responses: {result['aborted']}")
    for failure in result["failures"]:
        typer.echo(f"FAILED ({failure['target']}): {failure['problems']}\n  {failure['case']}")
    if as_json:
        typer.echo(json.dumps(result))
    if result["failed"]:
        raise typer.Exit(1)
