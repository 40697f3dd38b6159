"""Entry point of the ``lore`` command: a table of sub-commands."""

from __future__ import annotations

import typer

from lore_gateway import __version__

app = typer.Typer(
    name="lore",
    help="lore-gateway: a transparent memory proxy for AI coding agents.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
bench_app = typer.Typer(
    help="Benchmarks. Each prints a table; --json adds machine-readable figures."
)
app.add_typer(bench_app, name="bench")


def _version(value: bool) -> None:
    if value:
        typer.echo(f"lore-gateway {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    """lore-gateway: a transparent memory proxy for AI coding agents."""


def _register() -> None:
    # Each module attaches its commands to ``app`` / ``bench_app`` on import.
    from lore_gateway.cli import (  # noqa: F401
        bench_gateway,
        bench_memory,
        bench_reliability,
        doctor,
        logs,
        memory_cmds,
        run,
        serve,
        setup,
    )


def main() -> None:
    _register()
    app()
