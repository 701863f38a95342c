"""Run ASGI apps on already-bound sockets with hypercorn or uvicorn, in one event loop.

Which one runs is decided by `serve.http.server_choice` (``http_server: auto`` picks uvicorn unless
a hypercorn-only setting such as ``http2`` is on).

Both stop on one shared event; the signal handlers are the caller's, never the servers' own (each
hypercorn ``serve()`` would otherwise replace the previous one's handler and leave a server
running). Shutdown is in two steps: stop listening, then (after the drain) close connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Generator, Sequence
from typing import Any

from serve.http.header_limit import HeadLimit, limited_httptools

logger = logging.getLogger(__name__)

Binding = tuple[Any, socket.socket]
DEFAULT_MAX_HEADER_SIZE = 16 * 1024  # serve.config.Config.max_header_size


async def run_servers(
    bindings: Sequence[Binding],
    kind: str,
    stop: asyncio.Event,
    graceful_timeout: float,
    drained: asyncio.Event | None = None,
    tls: Sequence[Any] | None = None,
    max_header_size: int = DEFAULT_MAX_HEADER_SIZE,
) -> None:
    """Serve every ``(app, socket)`` until ``stop`` is set; then shut down in two steps.

    On ``stop`` every listening socket is closed at once (every copy of it: new connections are
    refused by the kernel, not queued), while open connections stay up: the apps answer what
    arrives on them (see `serve.http.draining`). When ``drained`` is set (default: ``stop``), the
    connections are closed and requests still being answered get ``graceful_timeout`` seconds.
    ``tls`` holds, per binding, the `serve.http.tls.TlsFiles` that binding serves HTTPS
    with, or None. A request whose line and headers take more than ``max_header_size`` bytes
    is answered 431 and its connection closed (`serve.http.header_limit`).
    """
    runner = _run_uvicorn if kind == "uvicorn" else _run_hypercorn
    done = drained or stop
    per_binding = list(tls) if tls is not None else [None] * len(bindings)
    await asyncio.gather(
        *(
            runner(app, sock, stop, done, graceful_timeout, files, max_header_size)
            for (app, sock), files in zip(bindings, per_binding, strict=True)
        )
    )


async def _run_hypercorn(
    app: Any,
    sock: socket.socket,
    stop: asyncio.Event,
    drained: asyncio.Event,
    grace: float,
    tls: Any = None,
    max_header_size: int = DEFAULT_MAX_HEADER_SIZE,
) -> None:
    # hypercorn's serve() closes its listeners and its idle connections in one step, on one
    # trigger; we accept connections ourselves (hypercorn's own per-connection server does the
    # HTTP) so that the listener closes on SIGTERM and the connections only after the drain.
    from hypercorn.asyncio.tcp_server import TCPServer
    from hypercorn.asyncio.worker_context import WorkerContext
    from hypercorn.config import Config
    from hypercorn.utils import wrap_app

    config = Config()
    config.accesslog = None
    config.errorlog = logging.getLogger("hypercorn.error")
    config.graceful_timeout = grace
    config.keep_alive_timeout = 75.0
    config.h11_max_incomplete_size = max_header_size  # h11 answers 431 past it
    config.h2_max_header_list_size = max_header_size  # HTTP/2: advertised, then enforced by h2
    if tls is not None:
        tls.apply_to_hypercorn(config)
    ssl = config.create_ssl_context() if config.ssl_enabled else None
    loop = asyncio.get_running_loop()
    context = WorkerContext(None)
    wrapped = wrap_app(HeadLimit(app, max_header_size), config.wsgi_max_body_size, "asgi")
    connections: set[asyncio.Task[Any]] = set()

    async def on_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            connections.add(task)
            task.add_done_callback(connections.discard)
        await TCPServer(wrapped, loop, config, context, {}, reader, writer)

    server = await asyncio.start_server(
        on_connection,
        sock=sock,
        backlog=config.backlog,
        ssl=ssl,
        ssl_handshake_timeout=config.ssl_handshake_timeout if ssl else None,
    )
    try:
        await stop.wait()
    finally:
        server.close()
        sock.close()
    await drained.wait()
    await context.terminated.set()  # idle keep-alive connections close now
    if connections:
        await asyncio.wait(set(connections), timeout=grace)


async def _run_uvicorn(
    app: Any,
    sock: socket.socket,
    stop: asyncio.Event,
    drained: asyncio.Event,
    grace: float,
    tls: Any = None,
    max_header_size: int = DEFAULT_MAX_HEADER_SIZE,
) -> None:
    try:
        import uvicorn
    except ImportError as exc:  # removed from the environment by hand
        raise RuntimeError(
            "http_server 'uvicorn' needs uvicorn (a dependency): pip install uvicorn"
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
        # uvicorn declares an int, and passes it to asyncio.wait_for: a float works.
        timeout_graceful_shutdown=grace,  # type: ignore[arg-type]
        timeout_keep_alive=75,
        http=limited_httptools(max_header_size) if _has("httptools") else "h11",
        h11_max_incomplete_event_size=max_header_size,  # h11 answers 400 past it
        **(tls.uvicorn_options() if tls is not None else {}),
    )
    server = _Server(config)

    async def _stopper() -> None:
        await stop.wait()
        for listener in getattr(server, "servers", []):  # set once uvicorn has started
            listener.close()
        sock.close()
        await drained.wait()
        server.should_exit = True  # uvicorn closes idle connections and finishes busy ones

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
    # Not inheritable (Python's default): a worker process (user code) holding a copy would keep
    # the port accepting after the frontend closed it, and could accept on it itself.
    return sock
