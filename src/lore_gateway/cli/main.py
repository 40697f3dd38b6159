"""Entry point of the ``lore`` command: a table of sub-commands.

``main`` is also where errors become one line: a ``UserError`` or an invalid setting
exits 2 with its message; anything unexpected exits 1 with one line saying how to
see the traceback (``LORE_LOG_LEVEL=debug``, which lets it through).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any

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


def _register(argv: Sequence[str] = ()) -> None:
    # Each module attaches its commands to ``app`` / ``bench_app`` on import.
    if list(argv[:1]) == ["serve"]:
        # The gateway's own process: only its command, so it never holds the other
        # commands' imports (rich among them; docs/benchmarks.md "Memory").
        from lore_gateway.cli import serve
        return
    from lore_gateway.cli import (  # noqa: F401
        amnesia_cmd,
        bench_coding,
        bench_footprint,
        bench_gateway,
        bench_import,
        bench_memory,
        bench_reliability,
        bench_retention,
        config_cmd,
        db_cmds,
        doctor,
        embed_cmd,
        forget_cmd,
        keys,
        knowledge_cmds,
        logs,
        mcp_cmd,
        memory_cmds,
        run,
        serve,
        setup,
        status,
        uninstall,
    )


def _debug() -> bool:
    level = os.environ.get("LORE_LOG_LEVEL")
    if level is None:
        from lore_gateway.config import SettingsError, read_config_file

        try:
            level = str(read_config_file().get("log_level", ""))
        except SettingsError:
            return False
    return level.strip().lower() == "debug"


def _command_path(ctx: Any) -> str:
    """``lore data list`` however the program was started (``python -m ...`` too)."""
    names = []
    while ctx.parent is not None:
        names.append(ctx.info_name)
        ctx = ctx.parent
    return " ".join(["lore", *reversed(names)])


def main() -> None:
    from lore_gateway.cli.output import UserError, error
    from lore_gateway.config import SettingsError

    # The click that typer runs on (typer >= 0.20 vendors its own copy).
    click = sys.modules[typer.BadParameter.__module__]
    _register(sys.argv[1:])
    try:
        result = app(standalone_mode=False)
    except (UserError, SettingsError) as exc:
        if _debug():
            raise
        error(str(exc))
        sys.exit(2)
    except click.UsageError as exc:
        if type(exc).__name__ == "NoArgsIsHelpError" or exc.ctx is None:
            exc.show()  # `lore` or `lore data` alone: the help text
        else:
            # One line instead of click's usage block: what was wrong, where help is.
            error(f"{exc.format_message()} (see `{_command_path(exc.ctx)} --help`)")
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except typer.Abort:
        error("aborted")
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as exc:
        if _debug():
            raise
        error(f"unexpected {type(exc).__name__}: {exc} (run with LORE_LOG_LEVEL=debug for "
              "the traceback, and please report it)")
        sys.exit(1)
    sys.exit(result if isinstance(result, int) else 0)
