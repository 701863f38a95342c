"""A request head larger than ``max_header_size`` is answered 431, on uvicorn as on hypercorn.

hypercorn (h11) refuses a head that outgrows ``h11_max_incomplete_size`` with 431 itself; uvicorn's
httptools parser has no such bound and reads a 64 MiB header before answering. `limited_httptools`
is uvicorn's httptools protocol with the same bound: the request line and headers together may
take ``limit`` bytes. A head that completes is measured exactly; one still arriving is refused as
soon as the bytes read for it pass the limit (a head that starts in the same read as a pipelined
request's end is counted from the next read), so little more than ``limit`` is ever
held. The answer is ``431 Request Header Fields Too Large`` and the connection is closed.
"""

from __future__ import annotations

from typing import Any

_BODY = b"Request header fields too large\n"
RESPONSE_431 = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
    b"content-type: text/plain; charset=utf-8\r\n"
    b"content-length: " + str(len(_BODY)).encode() + b"\r\n"
    b"connection: close\r\n\r\n" + _BODY
)


class HeadTooLarge(Exception):
    """Raised inside the parser's callback to stop it once the 431 is sent."""


def head_size(method: bytes, url: bytes, headers: list[tuple[bytes, bytes]]) -> int:
    """Bytes of ``METHOD url HTTP/1.1\\r\\n`` and each ``name: value\\r\\n`` line."""
    return len(method) + len(url) + 12 + sum(len(n) + len(v) + 4 for n, v in headers)


def limited_httptools(limit: int) -> type[Any]:
    """uvicorn's ``HttpToolsProtocol`` answering 431 to a head over ``limit`` bytes."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class LimitedHttpToolsProtocol(HttpToolsProtocol):
        _head_open = False  # between a message's first byte and the end of its headers
        _head_bytes = 0  # bytes read for the open head (at most: see data_received)
        _tail_read = False  # the read being parsed ended the message before
        _read = 0  # bytes of the read being parsed
        _head_in_read = False  # the open head began in the read being parsed
        _refused = False

        def data_received(self, data: bytes) -> None:
            if self._refused:
                return
            was_open, self._tail_read, self._read = self._head_open, False, len(data)
            super().data_received(data)
            if not self._head_open or self._refused:
                return
            self._head_in_read = False
            if was_open or not self._tail_read:
                self._head_bytes += len(data)
            # else the head began after a pipelined message's tail in this read: not counted,
            # so that the tail's bytes never count against it (one read less, at most).
            if self._head_bytes > limit:
                self._refuse()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._head_open, self._head_bytes, self._head_in_read = True, 0, True

        def on_message_complete(self) -> None:
            self._tail_read = True
            super().on_message_complete()

        def on_headers_complete(self) -> None:
            self._head_open = False
            # A head begun in this read is at most this read's bytes; `head_size` counts ": " and
            # CRLF per header line, one byte more than a client's ":" without the space (httptools
            # refuses a bare LF). 2 per line is a margin: only a head near the limit is measured.
            surely_within = self._head_in_read and self._read + 2 * len(self.headers) < limit
            if (
                not surely_within
                and head_size(self.parser.get_method(), self.url, self.headers) > limit
            ):
                self._refuse()
                raise HeadTooLarge
            super().on_headers_complete()

        def send_400_response(self, msg: str) -> None:
            if not self._refused:  # the parser's error after HeadTooLarge: answered already
                super().send_400_response(msg)

        def _refuse(self) -> None:
            self._refused = True
            self.transport.write(RESPONSE_431)
            self.transport.close()

    return LimitedHttpToolsProtocol


class HeadLimit:
    """ASGI guard for hypercorn: h11 bounds only a head still incomplete, so one that arrived
    in a single read (up to 64 KiB) is parsed whole; this answers it 431 before the app runs."""

    def __init__(self, app: Any, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and self._size(scope) > self.limit:
            await send(
                {
                    "type": "http.response.start",
                    "status": 431,
                    "headers": [
                        (b"content-type", b"text/plain; charset=utf-8"),
                        (b"connection", b"close"),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": _BODY})
            return
        await self.app(scope, receive, send)

    @staticmethod
    def _size(scope: Any) -> int:
        url = scope.get("raw_path", b"") + b"?" + scope.get("query_string", b"")
        return head_size(scope["method"].encode(), url, scope.get("headers", ()))
