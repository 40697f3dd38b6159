"""``lore config show [--json]`` and ``lore config path``.

Generic over ``Settings``: every field is listed with its effective value and where
that came from (flag, environment, config file or default), so settings added later
show up here without any change.
"""

from __future__ import annotations

from typing import Any

import typer

from lore_gateway.cli import output, preflight
from lore_gateway.cli.main import app
from lore_gateway.config import Settings, config_path, env_name, origins

config_app = typer.Typer(help="The config file and the effective settings.",
                         no_args_is_help=True)
app.add_typer(config_app, name="config")


def _value(value: Any) -> Any:
    return value if isinstance(value, (bool, int, float, str, type(None))) else str(value)


@config_app.command("show")
def show(as_json: bool = typer.Option(False, "--json", help="Print one JSON object.")) -> None:
    """Every setting: its effective value and where it came from."""
    settings = preflight.settings()
    where = origins()
    rows = [(name, _value(getattr(settings, name)), env_name(name), str(where[name]))
            for name in Settings.model_fields]
    if as_json:
        output.print_json({"config_file": str(config_path()),
                           "config_file_exists": config_path().exists(),
                           "settings": {name: {"value": value, "env": env, "source": source}
                                        for name, value, env, source in rows}})
        return
    output.line(f"config file: {config_path()}"
                + ("" if config_path().exists() else " (absent)"))
    output.print_table(
        [output.Column("setting", wrap=False), output.Column("value"),
         output.Column("from")],
        [(name, str(value).lower() if isinstance(value, bool) else value, source)
         for name, value, _, source in rows],
    )


@config_app.command("path")
def path() -> None:
    """The config file's path ($LORE_CONFIG, else $XDG_CONFIG_HOME/lore/config.toml,
    else ~/.config/lore/config.toml), whether or not it exists."""
    typer.echo(str(config_path()))
