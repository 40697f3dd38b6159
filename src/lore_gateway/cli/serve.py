"""``lore serve``: run the gateway in the foreground."""

from __future__ import annotations

import asyncio

import typer

from lore_gateway.cli.main import app
from lore_gateway.config import Settings

_HELP = """Start the gateway and serve until interrupted.

Configuration comes from LORE_* environment variables (flags override them):

  LORE_HOST / --host           listen address (default 127.0.0.1)\n
  LORE_PORT / --port           listen port (default 3207)\n
  LORE_UPSTREAM_OPENAI         OpenAI base URL; /v1/... is appended (default https://api.openai.com)\n
  LORE_UPSTREAM_CHATGPT        ChatGPT backend base; /codex/responses is appended
                               (default https://chatgpt.com/backend-api)\n
  LORE_UPSTREAM_ANTHROPIC      Anthropic base URL (default https://api.anthropic.com)\n
  LORE_DATA_DIR                database and logs
                               (default $XDG_DATA_HOME/lore, else ~/.local/share/lore)\n
  LORE_LOG_LEVEL               debug, info, warning or error (default info)\n
  LORE_LOG_FORMAT              text or json (default text)\n
  LORE_STORE                   store turns in memory (default true)\n
  LORE_EMBEDDINGS              use the offline embedding model for search (default true)
"""


@app.command(help=_HELP)
def serve(
    host: str = typer.Option(None, "--host", help="Listen address [env: LORE_HOST]."),
    port: int = typer.Option(None, "--port", help="Listen port [env: LORE_PORT]."),
) -> None:
    overrides = {k: v for k, v in {"host": host, "port": port}.items() if v is not None}
    settings = Settings(**overrides)  # type: ignore[arg-type]
    from lore_gateway.obs.logging import configure_logging, log_file_path

    configure_logging(settings.log_level, settings.log_format, log_file_path(settings.data_dir))
    try:
        import uvloop

        uvloop.run(_serve(settings))
    except ImportError:
        asyncio.run(_serve(settings))
    except KeyboardInterrupt:
        pass


async def _serve(settings: Settings) -> None:
    from lore_gateway.server import Gateway

    gateway = Gateway(settings)
    await gateway.start()
    url = gateway.url
    typer.echo(
        f"lore-gateway listening on {url} — Codex: lore run codex (or base_url {url}/v1); "
        f"Claude Code: ANTHROPIC_BASE_URL={url}",
        err=True,
    )
    try:
        await gateway.wait()
    finally:
        await gateway.stop()
