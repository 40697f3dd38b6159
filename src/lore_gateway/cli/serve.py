"""``lore serve``: run the gateway in the foreground."""

from __future__ import annotations

import asyncio
import os
import signal

import typer

from lore_gateway.cli import preflight
from lore_gateway.cli.main import app
from lore_gateway.config import Settings

_HELP = """Start the gateway and serve until interrupted.

Settings come from the config file (`lore config path`), then LORE_* environment
variables, then --host and --port. The defaults need no configuration;
`lore config show` prints every setting and where it came from.

\b
  LORE_HOST / --host         listen address (127.0.0.1)
  LORE_PORT / --port         listen port (3207)
  LORE_UPSTREAM_OPENAI       OpenAI base URL, /v1/... appended (https://api.openai.com)
  LORE_UPSTREAM_CHATGPT      ChatGPT backend, /codex/responses appended
                             (https://chatgpt.com/backend-api)
  LORE_UPSTREAM_ANTHROPIC    Anthropic base URL (https://api.anthropic.com)
  LORE_DATA_DIR              database and logs ($XDG_DATA_HOME/lore or ~/.local/share/lore)
  LORE_LOG_LEVEL             debug, info, warning or error (info)
  LORE_LOG_FORMAT            text or json (text)
  LORE_STORE                 store every turn in memory (true)
  LORE_RECALL                give the model the hidden recall tool (true)
  LORE_EMBEDDINGS            use the offline embedding model in search (true)
  LORE_WORKER                background model calls after a response: distill,
                             curate (true; off sends none)
  LORE_WORKER_DAILY_TOKENS   worker tokens per tenant per UTC day (200000)
  LORE_KNOWLEDGE             give sessions their project's knowledge (true)
  LORE_EXPORT                write .lore.md in git work trees (true)
  LORE_SHUTDOWN_GRACE        seconds open responses get on SIGINT/SIGTERM (10);
                             a second signal exits at once

More settings (limits, timeouts, worker models) are listed in the README.
"""


@app.command(help=_HELP)
def serve(
    host: str = typer.Option(None, "--host", help="Listen address (env LORE_HOST)."),
    port: int = typer.Option(None, "--port", help="Listen port (env LORE_PORT)."),
) -> None:
    settings = preflight.settings(host=host, port=port)
    preflight.require_data_dir(settings)
    preflight.require_port(settings)
    from lore_gateway.obs.logging import configure_logging, log_file_path

    configure_logging(settings.log_level, settings.log_format, log_file_path(settings.data_dir))
    try:
        import uvloop

        uvloop.run(_serve(settings))
    except ImportError:
        asyncio.run(_serve(settings))
    except KeyboardInterrupt:
        pass


def _banner(settings: Settings, url: str) -> list[str]:
    from lore_gateway.cli.status import banner
    from lore_gateway.obs.status import Live, snapshot

    return banner(snapshot(settings, Live(listen=url)))


async def _serve(settings: Settings) -> None:
    from lore_gateway import heap
    from lore_gateway.server import Gateway

    # Freed heap (a burst's bodies and streams) goes back to the OS instead of
    # staying resident: one malloc_trim(0) on a live gateway under the soak
    # took it from 366 to 308 MB (docs/reliability.md).
    heap.start_trimmer()
    gateway = Gateway(settings)
    await gateway.start()
    if gateway.memory is not None and settings.recall:
        gateway.memory.warm_search()
    loop = asyncio.get_running_loop()
    signals = 0

    def on_signal() -> None:
        # The first signal drains (LORE_SHUTDOWN_GRACE), the second exits at once.
        # Exiting mid-write cannot corrupt the database: SQLite's WAL rolls an
        # unfinished commit back, like a crash; only the queued turns are lost.
        nonlocal signals
        signals += 1
        if signals == 1:
            typer.echo(f"lore-gateway stopping: open responses get "
                       f"{settings.shutdown_grace:g} s (press Ctrl-C again to exit now)",
                       err=True)
            gateway.request_stop()
            return
        typer.echo("lore-gateway exiting now; turns still queued are not stored", err=True)
        os._exit(130)

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)
    typer.echo("\n".join(await asyncio.to_thread(_banner, settings, gateway.url)), err=True)
    try:
        await gateway.wait()
    finally:
        await gateway.stop()
