"""Run ASGI apps on already-bound sockets with hypercorn (default) or uvicorn, in one event loop.

Both stop on one shared event; the signal handlers are the caller's, never the servers' own (each
hypercorn ``serve()`` would otherwise replace the previous one's handler and leave a server
running).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Generator, Sequence
from typing import Any

logger = logging.getLogger(__name__)

Binding = tuple[Any, socket.socket]


async def run_servers(
    bindings: Sequence[Binding],
    kind: str,
    stop: asyncio.Event,
    graceful_timeout: float,
    tls: Sequence[Any] | None = None,
) -> None:
    """Serve every ``(app, socket)`` until ``stop`` is set, then close gracefully.

    ``tls`` holds, per binding, the `serve.tls.TlsFiles` that binding serves HTTPS with, or None.
    """
    runner = _run_uvicorn if kind == "uvicorn" else _run_hypercorn
    per_binding = list(tls) if tls is not None else [None] * len(bindings)
    await asyncio.gather(
        *(
            runner(app, sock, stop, graceful_timeout, files)
            for (app, sock), files in zip(bindings, per_binding, strict=True)
        )
    )


async def _run_hypercorn(
    app: Any, sock: socket.socket, stop: asyncio.Event, grace: float, tls: Any = None
) -> None:
    from hypercorn.asyncio import serve
    from hypercorn.config import Config

    config = Config()
    # hypercorn takes ownership of the descriptor it is given: hand it a duplicate.
    config.bind = [f"fd://{os.dup(sock.fileno())}"]
    config.accesslog = None
    config.errorlog = logging.getLogger("hypercorn.error")
    config.graceful_timeout = grace
    config.keep_alive_timeout = 75.0
    if tls is not None:
        tls.apply_to_hypercorn(config)
    await serve(app, config, shutdown_trigger=stop.wait, mode="asgi")


async def _run_uvicorn(
    app: Any, sock: socket.socket, stop: asyncio.Event, grace: float, tls: Any = None
) -> None:
    try:
        import uvicorn
    except ImportError as exc:  # the optional extra is not installed
        raise RuntimeError(
            "http_server 'uvicorn' needs the uvicorn extra: pip install 'lantern-serve[uvicorn]'"
        ) from exc

    class _Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Generator[None, None, None]:
            yield  # our caller owns the signal handlers

    config = uvicorn.Config(
        app,
        lifespan="off",
        access_log=False,
        log_config=None,
        timeout_graceful_shutdown=grace,
        timeout_keep_alive=75,
        http="httptools" if _has("httptools") else "h11",
        **(tls.uvicorn_options() if tls is not None else {}),
    )
    server = _Server(config)

    async def _stopper() -> None:
        await stop.wait()
        server.should_exit = True

    stopper = asyncio.create_task(_stopper())
    try:
        await server.serve(sockets=[sock])
    finally:
        stopper.cancel()


def _has(module: str) -> bool:
    try:
        __import__(module)
    except ImportError:
        return False
    return True


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket; port 0 picks a free one (read it back with getsockname)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # Name the protocol: asyncio sets TCP_NODELAY only on sockets whose proto is IPPROTO_TCP, and
    # accepted sockets inherit ours. With proto 0, Nagle's algorithm meets delayed ACKs and every
    # response sent in two writes (head, then body) stalls ~40 ms on the default event loop.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, port))
    sock.listen(1024)
    sock.set_inheritable(True)
    return sock
