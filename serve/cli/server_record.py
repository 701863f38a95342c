"""The server record (``--pid-file``): who is running, where, and proof that it is still them.

A record is a small JSON file that ``serve start`` writes and ``serve stop | status | logs`` read.
It names the server's pid, addresses, working directory and log folder, and its *identity*: the
process start time (``/proc/<pid>/stat`` field 22, in clock ticks since boot) and command line
captured when the server started. A pid is only trusted, and only ever signalled, while the
process holding it still has that start time and command line; a pid the kernel reused for an
unrelated program is never signalled.

The default record is per user: ``$XDG_RUNTIME_DIR/lantern/server.json`` when that folder exists
(systemd creates it at login, private to the user, cleared at logout), else
``~/.lantern/server.json``. ``--pid-file`` or ``LANTERN_PID_FILE`` choose another.
"""

from __future__ import annotations

import contextlib
import enum
import json
import os
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ENV_VAR = "LANTERN_PID_FILE"


def default_path(env: Mapping[str, str] | None = None) -> Path:
    """Where the record lives when neither ``--pid-file`` nor ``LANTERN_PID_FILE`` says."""
    environ = os.environ if env is None else env
    runtime = environ.get("XDG_RUNTIME_DIR")
    if runtime and Path(runtime).is_dir():
        return Path(runtime) / "lantern" / "server.json"
    home = environ.get("HOME") or str(Path.home())
    return Path(home) / ".lantern" / "server.json"


def record_path(value: str | None, env: Mapping[str, str] | None = None) -> Path:
    """``--pid-file`` if given, else ``LANTERN_PID_FILE``, else `default_path`; made absolute."""
    environ = os.environ if env is None else env
    return Path(value or environ.get(ENV_VAR) or default_path(environ)).resolve()


@dataclass(frozen=True)
class Identity:
    """What tells one process apart from a later one that got the same pid."""

    start_time: str  # /proc/<pid>/stat starttime (ticks since boot), or `ps -o lstart`
    cmdline: list[str]


def identity_of(pid: int) -> Identity | None:
    """The identity of a live process, or None when it does not exist (or is a zombie)."""
    proc = Path(f"/proc/{pid}")
    if Path("/proc/self/stat").exists():
        try:
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            raw = (proc / "cmdline").read_bytes()
        except OSError:
            return None
        if fields[0] == "Z":  # exited, not yet reaped: gone for us
            return None
        # fields[0] is field 3 (state), so field 22 (starttime) is fields[19].
        return Identity(fields[19], [a.decode(errors="replace") for a in raw.split(b"\0") if a])
    return _identity_from_ps(pid)


def _identity_from_ps(pid: int) -> Identity | None:
    """Systems without /proc (macOS): ``ps`` gives the start time and command line."""
    try:
        out = subprocess.run(
            ["ps", "-o", "stat=", "-o", "lstart=", "-o", "command=", "-p", str(pid)],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    if not out or out.startswith("Z"):
        return None
    parts = out.split()
    # lstart is five words: "Tue Dec  1 10:40:43 2026"
    return Identity(" ".join(parts[1:6]), parts[6:])


class Status(enum.Enum):
    """What a record says about the world now."""

    MISSING = "missing"  # no record file (or unreadable)
    RUNNING = "running"  # the recorded process is alive and is the one that wrote the record
    EXITED = "exited"  # the recorded pid is gone
    OTHER = "other"  # the pid is alive but belongs to another program (reused, or unverifiable)


@dataclass
class Record:
    """A record file and what it holds."""

    path: Path
    data: dict[str, Any]

    @property
    def pid(self) -> int:
        return int(self.data["pid"])

    @property
    def addresses(self) -> dict[str, str]:
        return dict(self.data.get("addresses") or {})

    @property
    def cwd(self) -> str:
        return str(self.data.get("cwd") or "?")

    def status(self) -> Status:
        now = identity_of(self.pid)
        if now is None:
            return Status.EXITED
        recorded = self.data.get("identity") or {}
        if now.start_time == recorded.get("start_time") and now.cmdline == recorded.get("cmdline"):
            return Status.RUNNING
        return Status.OTHER

    def program(self) -> str:
        """The command line now running under the recorded pid, shortened for one line."""
        now = identity_of(self.pid)
        text = " ".join(now.cmdline) if now else "?"
        return text if len(text) <= 60 else text[:57] + "..."

    def describe(self) -> str:
        """``pid 12, started in /dir: inference http://..., management http://...``."""
        where = ", ".join(f"{name} {address}" for name, address in self.addresses.items())
        return f"pid {self.pid}, started in {self.cwd}: {where}"

    def remove(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


def read(path: Path) -> Record | None:
    """The record at ``path``, or None when there is none or it is not a record."""
    try:
        data = json.loads(path.read_text())
        int(data["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return Record(path, data) if isinstance(data, dict) else None


def write(path: Path, data: dict[str, Any]) -> None:
    """Write the calling process's record atomically, with its identity, pid and folder."""
    pid = os.getpid()
    me = identity_of(pid)
    record = {
        **data,
        "pid": pid,
        "cwd": os.getcwd(),
        "identity": {"start_time": me.start_time, "cmdline": me.cmdline} if me else None,
    }
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{pid}.tmp")
    tmp.write_text(json.dumps(record, indent=1))
    os.replace(tmp, path)


def remove_own(path: Path) -> None:
    """Remove the record if it is this process's own (a newer server's record is left alone)."""
    record = read(path)
    if record is not None and record.pid == os.getpid():
        record.remove()
