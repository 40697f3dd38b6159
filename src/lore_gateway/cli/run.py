"""``lore run codex|claude|opencode|gemini [-- agent args...]``: one command to put an
agent behind lore.

If no gateway answers on the configured port, one is started in the background
(``python -m lore_gateway serve``, its own session so the terminal's Ctrl-C goes
to the agent alone) and stopped with SIGTERM once the agent exits, letting it
drain the storage queue. A gateway that was already running is left alone. The
agent's exit code becomes ours.
"""

from __future__ import annotations

import collections
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from types import FrameType
from typing import IO

import orjson
import typer

from lore_gateway.agents import claude, codex, gemini, jsonc, opencode
from lore_gateway.cli import output
from lore_gateway.cli.main import app
from lore_gateway.cli.output import UserError
from lore_gateway.config import Settings

AGENTS = ("codex", "claude", "opencode", "gemini")
# The gateway opens its database and binds in well under a second; allow for a
# cold disk cache and a busy machine before declaring failure.
STARTUP_TIMEOUT_S = 30.0
STARTUP_POLL_S = 0.05
# A graceful stop flushes queued turns; after this the process is killed.
STOP_TIMEOUT_S = 15.0
HEALTH_TIMEOUT_S = 1.0
# Lines of the background gateway's stderr kept to explain a failed start.
STDERR_TAIL_LINES = 40


def probe_health(base_url: str, timeout: float = HEALTH_TIMEOUT_S) -> dict[str, object] | None:
    """The gateway's ``/health`` document, or None when nothing healthy answers."""
    try:
        with urllib.request.urlopen(f"{base_url}/health", timeout=timeout) as response:
            data = orjson.loads(response.read(64 * 1024))
    except (OSError, ValueError, urllib.error.URLError):
        return None
    if isinstance(data, dict) and data.get("status") == "ok":
        return data
    return None


def port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.settimeout(HEALTH_TIMEOUT_S)
        return sock.connect_ex((host, port)) == 0


class BackgroundGateway:
    """A ``lore serve`` child process started and stopped by ``lore run``."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.process: subprocess.Popen[bytes] | None = None
        self._stderr_tail: collections.deque[str] = collections.deque(maxlen=STDERR_TAIL_LINES)

    def start(self) -> None:
        s = self.settings
        self.process = subprocess.Popen(
            [sys.executable, "-m", "lore_gateway", "serve", "--host", s.host,
             "--port", str(s.port)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        assert self.process.stderr is not None
        # Drained continuously so the child never blocks on a full pipe; only the
        # tail is kept (its full log is in the log file, see `lore logs`).
        threading.Thread(
            target=self._drain, args=(self.process.stderr,), name="lore-gateway-stderr",
            daemon=True,
        ).start()
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"the gateway exited with code {self.process.returncode} while starting:\n"
                    + self.stderr_tail()
                )
            if probe_health(s.base_url, timeout=STARTUP_POLL_S * 4) is not None:
                return
            time.sleep(STARTUP_POLL_S)
        self.stop()
        raise RuntimeError(
            f"the gateway did not answer {s.base_url}/health within {STARTUP_TIMEOUT_S:.0f} s:\n"
            + self.stderr_tail()
        )

    def _drain(self, stream: IO[bytes]) -> None:
        for line in stream:
            self._stderr_tail.append(line.decode("utf-8", "replace").rstrip())

    def stderr_tail(self) -> str:
        return "\n".join(self._stderr_tail) or "(no output)"

    def stop(self) -> None:
        process = self.process
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def resolve_binary(agent: str, name: str) -> str:
    path = shutil.which(name)
    if path is None:
        setting = f"LORE_{agent.upper()}_BIN"
        raise UserError(
            f"cannot find the {agent} binary {name!r} ({setting}): install it or set "
            f"{setting} to its path"
        )
    return path


def project_header_value(cwd: str) -> str | None:
    """cwd as an ``X-Lore-Project`` value, or None if it cannot travel in a header
    (the gateway then reads the project from the agent's own context text)."""
    if cwd and all(32 <= ord(ch) < 127 for ch in cwd):
        return cwd
    return None


def agent_command(
    agent: str, settings: Settings, args: list[str], env: Mapping[str, str], cwd: str
) -> tuple[list[str], dict[str, str]]:
    """The agent's argv and environment, pointed at the gateway.

    A gateway key in ``LORE_KEY`` is sent as ``X-Lore-Key`` (team mode needs it;
    a personal-mode gateway ignores it).
    """
    project = project_header_value(cwd)
    child_env = dict(env)
    key = gateway_key(settings, env)
    if agent == "codex":
        binary = resolve_binary("codex", settings.codex_bin)
        mode = codex.detect_auth_mode(env)
        key_env = codex.GATEWAY_KEY_ENV if key is not None else None
        overrides = codex.run_overrides(settings.base_url, mode, project, key_env)
        return [binary, *overrides, *args], child_env
    if agent == "opencode":
        binary = resolve_binary("opencode", settings.opencode_bin)
        try:
            child_env.update(opencode.run_env(settings.base_url, project, env, key))
        except jsonc.JsoncError as exc:
            raise UserError(f"{exc}: fix it or unset it") from None
        return [binary, *args], child_env
    if agent == "gemini":
        binary = resolve_binary("gemini", settings.gemini_bin)
        child_env.update(gemini.run_env(settings.base_url, project, env, key))
        return [binary, *args], child_env
    binary = resolve_binary("claude", settings.claude_bin)
    child_env.update(claude.run_env(settings.base_url, project, env, key))
    return [binary, *args], child_env


def gateway_key(settings: Settings, env: Mapping[str, str]) -> str | None:
    """The user's gateway key from ``LORE_KEY``; in team mode it is required."""
    key = env.get(codex.GATEWAY_KEY_ENV, "").strip() or None
    if key is None and settings.tenancy == "keys":
        raise RuntimeError(
            f"this gateway runs in team mode (LORE_TENANCY=keys): set {codex.GATEWAY_KEY_ENV} "
            "to your gateway key (the gateway's owner creates one with `lore keys create "
            "<name>`)")
    return key


@contextlib.contextmanager
def _forward_signals(process: subprocess.Popen[bytes]) -> Iterator[None]:
    """While the agent runs: Ctrl-C reaches it through the terminal's process
    group, so we ignore SIGINT ourselves; SIGTERM/SIGHUP sent to us are passed on."""

    def forward(signum: int, _frame: FrameType | None) -> None:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signum)

    previous = {
        signal.SIGINT: signal.signal(signal.SIGINT, signal.SIG_IGN),
        signal.SIGTERM: signal.signal(signal.SIGTERM, forward),
        signal.SIGHUP: signal.signal(signal.SIGHUP, forward),
    }
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def run_agent(agent: str, args: list[str], settings: Settings) -> int:
    env = dict(os.environ)
    cwd = os.getcwd()
    argv, child_env = agent_command(agent, settings, args, env, cwd)

    gateway: BackgroundGateway | None = None
    if probe_health(settings.base_url) is None:
        if port_in_use(settings.host, settings.port):
            from lore_gateway.cli.preflight import port_problem

            problem = port_problem(settings)
            raise UserError(str(problem) if problem else
                            f"{settings.host}:{settings.port} is taken by something that is "
                            "not a healthy lore gateway; set LORE_PORT to a free port")
        gateway = BackgroundGateway(settings)
        gateway.start()
    try:
        process = subprocess.Popen(argv, env=child_env)
        with _forward_signals(process):
            code = process.wait()
    finally:
        if gateway is not None:
            gateway.stop()
    # A signal death (-N) is reported the way a shell would: 128 + N.
    return 128 - code if code < 0 else code


@app.command(
    "run",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
)
def run_command(
    ctx: typer.Context,
    agent: str = typer.Argument(..., help="codex, claude, opencode or gemini"),
) -> None:
    """Run an agent through lore, starting a gateway for it if none is running.

    Claude Code runs with its auto-compaction off (DISABLE_AUTO_COMPACT=1, unless
    you set it): the gateway manages the context and answers /compact from memory.
    OpenCode gets the gateway as its Anthropic and OpenAI base URL through
    OPENCODE_CONFIG_CONTENT; no file is written. Gemini CLI gets it as
    GOOGLE_GEMINI_BASE_URL (it must sign in with a Gemini API key).

    Everything after ``--`` goes to the agent: lore run codex -- exec "say hi"
    """
    if agent not in AGENTS:
        raise typer.BadParameter(f"expected one of: {', '.join(AGENTS)}", param_hint="AGENT")
    try:
        from lore_gateway.cli import preflight

        code = run_agent(agent, list(ctx.args), preflight.settings())
    except RuntimeError as exc:  # the background gateway did not start
        output.error(f"lore run: {exc}")
        raise typer.Exit(1) from None
    raise typer.Exit(code)
