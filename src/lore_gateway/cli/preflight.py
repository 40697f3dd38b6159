"""Checks run before a command touches the port or the data dir.

Each returns ``None`` when all is well, or a ``Problem``: what is wrong, naming the
setting, and the fix; ``str()`` joins them into one line.
``lore serve`` and the memory commands raise it as a ``UserError``, and ``lore
doctor`` shows it as a failed check, so both say the same thing. An intact database
in a directory that cannot be written is reported as exactly that: nothing here ever
suggests moving a database aside.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import tempfile
from dataclasses import dataclass
from pathlib import Path

from lore_gateway.cli.output import UserError
from lore_gateway.cli.run import probe_health
from lore_gateway.config import (
    Origin,
    Settings,
    SettingsError,
    env_name,
    flag_name,
    load_settings,
    origins,
)

# Bounds the /proc scan that names the program holding a port.
MAX_PROCS_SCANNED = 4096


def settings(**flags: object) -> Settings:
    """``load_settings`` for a command: an invalid setting is a ``UserError``."""
    try:
        return load_settings(**flags)
    except SettingsError as exc:
        raise UserError(str(exc)) from None


@dataclass(frozen=True, slots=True)
class Problem:
    what: str
    fix: str

    def __str__(self) -> str:
        return f"{self.what}; {self.fix}"


def where(field: str, found: dict[str, Origin] | None = None) -> str:
    """How the user changes ``field``: the place it was set, or the usual ways."""
    origin = (found or origins()).get(field, Origin("default", ""))
    if origin.kind == "file":
        return f"{field} in {origin.name}"
    if origin.kind == "flag":
        return origin.name
    names = [env_name(field)]
    if field in ("host", "port"):
        names.append(flag_name(field))
    return " or ".join(names)


def data_dir_problem(settings: Settings) -> Problem | None:
    """Why the data dir cannot be used, or None. Creates it when missing."""
    path = settings.data_dir
    setting = where("data_dir")
    for parent in [path, *path.parents]:
        if parent.exists() and not parent.is_dir():
            return Problem(f"the data dir {path} ({setting}) cannot be created: {parent} is "
                           "a file, not a directory", f"set {setting} to a directory")
    if not path.exists():
        try:
            path.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as exc:
            return Problem(f"the data dir {path} ({setting}) cannot be created "
                           f"({exc.strerror})",
                           f"create it yourself or set {setting} to a writable directory")
    if not os.access(path, os.R_OK | os.X_OK):
        return Problem(f"the data dir {path} ({setting}) cannot be read",
                       f"fix its permissions (chmod u+rwx {path}) or set {setting} to "
                       "another directory")
    db = settings.db_path
    try:
        with tempfile.NamedTemporaryFile(dir=path, prefix=".lore-write-check-"):
            pass
        if db.exists():
            with db.open("r+b"):
                pass
    except OSError as exc:
        what = f"the database {db}" if exc.filename == str(db) else f"the data dir {path}"
        intact = " (the database is left as it is)" if db.exists() else ""
        return Problem(f"{what} is read-only ({exc.strerror}){intact}: lore writes its "
                       "memory and logs there",
                       f"make it writable (chmod -R u+w {path}) or set {setting} to a "
                       "writable directory")
    return None


SQLITE_HEADER = b"SQLite format 3\x00"


def database_problem(settings: Settings) -> Problem | None:
    """A database file that is not SQLite at all (its first 16 bytes say so)."""
    db = settings.db_path
    try:
        with db.open("rb") as handle:
            header = handle.read(len(SQLITE_HEADER))
    except OSError:
        return None  # absent (made on first start) or unreadable (data_dir_problem says)
    if header and header != SQLITE_HEADER:
        return Problem(f"{db} is not an SQLite database, so not lore's memory",
                       f"move it out of {settings.data_dir} (a fresh database is made on "
                       f"start) or set {where('data_dir')} to another directory")
    return None


def require_data_dir(settings: Settings) -> None:
    problem = data_dir_problem(settings) or database_problem(settings)
    if problem:
        raise UserError(str(problem))


def port_problem(settings: Settings) -> Problem | None:
    """Why ``lore serve`` cannot listen on host:port, or None."""
    host, port = settings.host, settings.port
    if port == 0:
        return None
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
    except socket.gaierror:
        return Problem(f"the listen address {host!r} ({where('host')}) is not a known host "
                       "name", f"set {where('host')} to an address such as 127.0.0.1")
    except OSError as exc:
        return _bind_failure(settings, exc)
    return None


def _bind_failure(settings: Settings, exc: OSError) -> Problem:
    host, port = settings.host, settings.port
    port_setting = where("port")
    if exc.errno == errno.EADDRINUSE:
        probe_host = "127.0.0.1" if host in ("0.0.0.0", "") else host
        url = f"http://{probe_host}:{port}" if ":" not in probe_host \
            else f"http://[{probe_host}]:{port}"
        health = probe_health(url)
        if health is not None:
            return Problem(f"a lore gateway (version {health.get('version', '?')}) is "
                           f"already listening on {url}",
                           "use it as it is (`lore status`, `lore run codex`), or set "
                           f"{port_setting} to another port to start a second one")
        holder = port_holder(port)
        by = f" by {holder}" if holder else " by another program"
        example = port_setting.split(" or ")[0]
        example += f" {port + 1}" if example.startswith("--") else f"={port + 1}"
        return Problem(f"port {port} on {host} is in use{by}, not by a lore gateway",
                       f"set {port_setting} to a free port (for example {example})")
    if exc.errno == errno.EACCES:
        return Problem(f"port {port} needs privileges to listen on",
                       f"set {port_setting} to a port above 1023")
    if exc.errno == errno.EADDRNOTAVAIL:
        return Problem(f"the listen address {host} ({where('host')}) is not an address of "
                       "this machine", f"set {where('host')} to 127.0.0.1 or one of its "
                       "addresses")
    return Problem(f"cannot listen on {host}:{port} ({exc.strerror})",
                   f"check {where('host')} and {port_setting}")


def port_holder(port: int) -> str | None:
    """``pid 123 (nginx)`` for the process listening on ``port``, when /proc shows it."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for row in Path(table).read_text().splitlines()[1:]:
                fields = row.split()
                # local_address is HEX_IP:HEX_PORT; state 0A is LISTEN.
                if len(fields) > 9 and fields[3] == "0A" and \
                        int(fields[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add(fields[9])
    if not inodes:
        return None
    wanted = {f"socket:[{inode}]" for inode in inodes}
    with contextlib.suppress(OSError):
        for scanned, entry in enumerate(os.scandir("/proc")):
            if scanned > MAX_PROCS_SCANNED:
                break
            if not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError):
                for fd in os.scandir(f"/proc/{entry.name}/fd"):
                    if os.readlink(fd.path) in wanted:
                        name = Path(f"/proc/{entry.name}/comm").read_text().strip()
                        return f"pid {entry.name} ({name})"
    return None


def require_port(settings: Settings) -> None:
    problem = port_problem(settings)
    if problem:
        raise UserError(str(problem))
