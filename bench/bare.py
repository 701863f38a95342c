"""The HTTP ceiling: a bare ASGI app on the same server runner Lantern uses.

``python -m bench.bare --server uvicorn --port-file F`` binds a free loopback port, writes it to
``F`` and serves until SIGTERM/SIGINT. The app reads the whole body and answers a small JSON
document, so the load generator sees the same shape of exchange as a prediction, with none of
Lantern's routing, batching or workers.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
from pathlib import Path
from typing import Any

from serve.http.servers import bind_socket, run_servers

_BODY = b'{"ok": true}\n'
_HEADERS = [(b"content-type", b"application/json"), (b"content-length", str(len(_BODY)).encode())]


async def bare_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The least an ASGI app can do for a POST: drain the body, answer 200."""
    if scope["type"] != "http":
        return
    more = True
    while more:
        message = await receive()
        more = message.get("more_body", False)
    await send({"type": "http.response.start", "status": 200, "headers": _HEADERS})
    await send({"type": "http.response.body", "body": _BODY})


async def serve(server: str, port_file: Path) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    sock = bind_socket("127.0.0.1", 0)
    tmp = port_file.with_suffix(".tmp")
    tmp.write_text(str(sock.getsockname()[1]))
    os.replace(tmp, port_file)
    await run_servers([(bare_app, sock)], server, stop, graceful_timeout=1.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", choices=["hypercorn", "uvicorn"], default="hypercorn")
    parser.add_argument("--port-file", type=Path, required=True)
    args = parser.parse_args()
    # The event loop `serve start` runs on (uvloop when installed): the ceiling must share it.
    from serve.cli.foreground import event_loop_runner

    event_loop_runner()(serve(args.server, args.port_file))


if __name__ == "__main__":
    main()
