"""Run the server in this process: logging, the event loop, and errors turned into exit codes.

Shared by ``serve start`` (foreground, or the detached child) and ``serve kserve``.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from serve.cli.control import CliError
from serve.cli.startup_report import EXIT_ADDRESS_IN_USE, EXIT_USAGE
from serve.config import Config, ConfigError

if TYPE_CHECKING:
    from serve.server import Server

# Set in the environment of the child a detached ``serve start`` runs.
DETACHED_ENV = "_LANTERN_DETACHED"


def run_foreground(
    config: Config,
    state_file: Path,
    *,
    restore: bool,
    on_started: Callable[[Server], None] | None = None,
) -> None:
    """Run the frontend here until it stops (``serve start --foreground``, ``serve kserve``);
    ``on_started`` is called once the startup models have loaded or failed (``serve llm``)."""
    from serve.logs import setup_logging
    from serve.server import Server

    detached = os.environ.get(DETACHED_ENV) == "1"
    if detached and config.log_dir:
        from serve.cli.console import capture_console

        capture_console(
            Path(config.log_dir) / "console.log", config.log_max_bytes, config.log_backup_count
        )
    setup_logging(
        config.log_dir,
        level=config.log_level,
        fmt=config.log_format,
        # A detached server's console is console.log, beside the log files: log only once.
        console=not detached,
        access_log=config.access_log,
        max_bytes=config.log_max_bytes,
        backup_count=config.log_backup_count,
    )

    async def run() -> None:
        server = Server(
            config, state_file=state_file, restore_snapshot=restore, on_started=on_started
        )
        await server.serve()

    from serve.server import ListenError

    try:
        event_loop_runner()(run())
    except ListenError as exc:  # names the address
        raise CliError(str(exc), EXIT_ADDRESS_IN_USE) from exc
    except ConfigError as exc:  # e.g. a certificate that cannot be used
        raise CliError(str(exc), EXIT_USAGE) from exc
    except OSError as exc:
        raise CliError(str(exc)) from exc


def event_loop_runner() -> Any:
    """uvloop's runner (installed where the platform has it), unless LANTERN_EVENT_LOOP=asyncio."""
    if os.environ.get("LANTERN_EVENT_LOOP", "auto") != "asyncio":
        try:
            import uvloop

            return uvloop.run
        except (ImportError, AttributeError):
            pass
    return asyncio.run
