"""Gateway configuration, read from ``LORE_*`` environment variables.

Every setting has an embedded default so that ``lore serve`` works on a fresh
machine with nothing configured. Command-line flags override the environment.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

MiB = 1024 * 1024


def default_data_dir() -> Path:
    """``$XDG_DATA_HOME/lore``, else ``~/.local/share/lore`` (the reference's location)."""
    xdg = os.environ.get("XDG_DATA_HOME")
    base = Path(xdg) if xdg else Path.home() / ".local" / "share"
    return base / "lore"


class Settings(BaseSettings):
    """All gateway settings. Field ``foo_bar`` is read from ``LORE_FOO_BAR``."""

    model_config = SettingsConfigDict(env_prefix="LORE_", extra="ignore", frozen=True)

    host: str = "127.0.0.1"
    port: int = 3207

    upstream_openai: str = "https://api.openai.com"
    upstream_chatgpt: str = "https://chatgpt.com/backend-api"
    upstream_anthropic: str = "https://api.anthropic.com"

    data_dir: Path = Field(default_factory=default_data_dir)
    log_level: str = "info"
    log_format: str = "text"

    # Largest request body accepted from a client. Agent requests carry the whole
    # conversation; Claude Code's first request alone is ~76 KB and long sessions
    # reach several MB, so the cap is generous.
    max_request_bytes: int = 64 * MiB
    # Upstream error bodies are relayed unchanged up to this size, then cut.
    max_error_body_bytes: int = 4 * MiB
    # Non-streamed upstream bodies are read whole; bound them.
    max_response_body_bytes: int = 64 * MiB

    # Seconds to open a connection to an upstream, and the longest silence
    # tolerated while reading a response (Codex's own stream idle timeout is 300 s).
    upstream_connect_timeout: float = 10.0
    upstream_read_timeout: float = 300.0

    # Connection hygiene (http_protocol.py): seconds for a request's headers to
    # arrive, longest silence mid-body, the largest header block, and the most
    # connections open at once (beyond it: 503). Agents keep a few connections
    # each; 1,000 is far above a workstation's need and far below the fd limit.
    header_timeout: float = 30.0
    body_timeout: float = 60.0
    max_header_bytes: int = 64 * 1024
    max_connections: int = 1000
    # On SIGINT/SIGTERM: seconds open streams get to finish before they are
    # ended with their protocol's error event.
    shutdown_grace: float = 10.0

    # Recall searches run in their own processes (memory/search_process.py) so
    # they never wait on the relay for the GIL; off: in a thread of the gateway.
    # Two workers: one search can run while another waits for the CPU (measured
    # in docs/reliability.md). A search that takes longer than the timeout fails
    # the recall, not the turn.
    search_process: bool = True
    search_workers: int = 2
    search_timeout: float = 10.0

    # Agent binaries launched by `lore run` (a name looked up on PATH, or a path).
    codex_bin: str = "codex"
    claude_bin: str = "claude"

    # Memory
    store: bool = True
    store_max_message_bytes: int = 256 * 1024
    embeddings: bool = True
    # Give the model the hidden recall tool (needs the memory store).
    recall: bool = True
    # Live Responses recall (lore-spec E.1): upstream bytes one streamed answer may
    # carry, state kept until a recall chain ends (item snapshots, the spooled
    # continuation), and events held back or hidden while a recall is open.
    recall_stream_max_bytes: int = 64 * MiB
    recall_retained_max_bytes: int = 16 * MiB
    recall_deferred_max_bytes: int = 1 * MiB

    @field_validator("upstream_openai", "upstream_chatgpt", "upstream_anthropic")
    @classmethod
    def _strip_trailing_slash(cls, value: str) -> str:
        return value.rstrip("/")

    @field_validator("log_level")
    @classmethod
    def _lower(cls, value: str) -> str:
        return value.lower()

    @property
    def db_path(self) -> Path:
        return self.data_dir / "lore.db"

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"
