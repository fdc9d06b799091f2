"""uvicorn's HTTP protocols with limits on the request head (request line and headers): a
connection that has not sent a whole head within --header-timeout of connecting (or of its last
answer) is closed; a head longer than --max-header-bytes, or with more than --max-headers
fields, is answered 431 and the connection closed. At most --max-header-bytes of a head ever
reach the parser: the bytes are counted before they are fed to it.

Why here, before the parser: httptools (what uvicorn picks when it is installed, as vLLM
installs it) has no limit on a head's size, and it gathers a header value that arrives in
several reads by concatenating bytes (`self._current_header_value += val` in
httptools/parser/parser.pyx), quadratic in the value's size: four connections sending 60 MB
headers held the event loop for seconds at a time. h11 buffers a whole head up to
`max_incomplete_event_size` (16 KiB by default, h11/_connection.py; uvicorn answers 400 past
it); vLLM raises that to 4 MiB and sets an `h11_max_header_count` of 256
(vllm/entrypoints/launchers/utils/constants.py), which no uvicorn protocol reads, and under
httptools neither applies. A pipelined request whose head starts inside the read that ended
the one before it is counted from its next read (a read is at most 256,000 bytes under uvloop).
"""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Callable
from typing import Any, Literal

import h11
import orjson
from uvicorn.protocols.http.h11_impl import H11Protocol

from residency.serve.settings import RequestLimits


class _Deadline:
    """Closes `transport` unless `seen()` moved on by the time the timer fires."""

    def __init__(self) -> None:
        self.timer: asyncio.TimerHandle | None = None
        self.requests = 0

    def arm(
        self, loop: asyncio.AbstractEventLoop, after_s: float, transport: asyncio.Transport
    ) -> None:
        self.disarm()
        self.timer = loop.call_later(after_s, self._expire, transport, self.requests)

    def headers_arrived(self) -> None:
        self.requests += 1
        self.disarm()

    def disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _expire(self, transport: asyncio.Transport, requests: int) -> None:
        if requests == self.requests and not transport.is_closing():
            transport.close()


class _Head:
    """The bytes and fields of the head being read, against the limits."""

    __slots__ = ("fields", "max_bytes", "max_fields", "reading", "refusal", "size")

    def __init__(self, limits: RequestLimits) -> None:
        self.max_bytes = limits.max_header_bytes
        self.max_fields = limits.max_headers
        self.refusal: str | None = None
        self.next_request()

    def next_request(self) -> None:
        """The last request's body is in: what arrives next is a head."""
        self.reading = True
        self.size = 0
        self.fields = 0

    def field(self) -> bool:
        """Count one header field; False (and the refusal set) past --max-headers."""
        self.fields += 1
        if self.fields > self.max_fields and self.refusal is None:
            self.refusal = f"more than --max-headers {self.max_fields} header fields"
        return self.refusal is None


def refusal_431(message: str) -> bytes:
    """The whole 431 answer: an OpenAI-shaped error, then the connection closes."""
    body = orjson.dumps(
        {
            "error": {
                "message": f"request headers refused: {message}",
                "type": "invalid_request_error",
                "code": "request_header_fields_too_large",
                "param": None,
            }
        }
    )
    head = (
        b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\nconnection: close\r\n\r\n"
    )
    return head % len(body) + body


def _feed_limited(
    head: _Head, transport: asyncio.Transport, data: bytes, feed: Callable[[bytes], None]
) -> None:
    """Hand `data` to the parser (`feed`), never more than the head's remaining bytes while a
    head is being read; answer 431 and close once a head is past a limit."""
    while data:
        if not head.reading:
            feed(data)
            return
        room = head.max_bytes - head.size
        part, data = (data, b"") if len(data) <= room else (data[:room], data[room:])
        head.size += len(part)
        feed(part)
        if transport.is_closing():
            return
        if head.refusal is None and head.reading and head.size >= head.max_bytes:
            limit = f"--max-header-bytes {head.max_bytes}"
            head.refusal = f"the request line and headers are longer than {limit}"
        if head.refusal is not None:
            transport.write(refusal_431(head.refusal))
            transport.close()
            return


class _CountedConnection(h11.Connection):
    """h11's server side, telling `head` when a head and a body are complete."""

    def __init__(self, head: _Head) -> None:
        # Our own count stops a head first; h11's buffer limit stays out of its way.
        super().__init__(h11.SERVER, max_incomplete_event_size=head.max_bytes + 1)
        self.head = head

    def next_event(self) -> Any:
        event = super().next_event()
        if isinstance(event, h11.Request):
            self.head.reading = False
            for _ in event.headers:
                if not self.head.field():
                    raise h11.RemoteProtocolError(self.head.refusal or "", error_status_hint=431)
        elif isinstance(event, h11.EndOfMessage):
            self.head.next_request()
        return event


def header_limited_protocol(
    limits: RequestLimits, http: Literal["auto", "h11"] = "auto"
) -> type[asyncio.Protocol]:
    """A protocol class for `uvicorn.Config(http=...)` that enforces --header-timeout,
    --max-header-bytes and --max-headers (`http`: as uvicorn's option, auto = httptools when
    installed)."""
    if http == "auto" and importlib.util.find_spec("httptools") is not None:
        return _httptools_protocol(limits)
    timeout_s = limits.header_timeout_s

    class H11Limited(H11Protocol):
        _deadline: _Deadline
        _head: _Head

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._head = _Head(limits)
            self.conn = _CountedConnection(self._head)

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._deadline = _Deadline()
            self._deadline.arm(self.loop, timeout_s, transport)

        def connection_lost(self, exc: Exception | None) -> None:
            self._deadline.disarm()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            _feed_limited(self._head, self.transport, data, super().data_received)

        def handle_events(self) -> None:
            cycle = self.cycle
            super().handle_events()
            if self.cycle is not cycle:  # a whole request line and headers arrived
                self._deadline.headers_arrived()

        def send_400_response(self, msg: str) -> None:
            if self._head.refusal is None:
                super().send_400_response(msg)
                return
            self.transport.write(refusal_431(self._head.refusal))
            self.transport.close()

        def on_response_complete(self) -> None:
            self._deadline.arm(self.loop, timeout_s, self.transport)  # before pipelined
            super().on_response_complete()

    return H11Limited


def _httptools_protocol(limits: RequestLimits) -> type[asyncio.Protocol]:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    timeout_s = limits.header_timeout_s

    class HttpToolsLimited(HttpToolsProtocol):
        _deadline: _Deadline
        _head: _Head

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._head = _Head(limits)
            self._deadline = _Deadline()
            self._deadline.arm(self.loop, timeout_s, transport)

        def connection_lost(self, exc: Exception | None) -> None:
            self._deadline.disarm()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            _feed_limited(self._head, self.transport, data, super().data_received)

        # Past --max-headers the parser goes on to the end of what it was fed (at most
        # --max-header-bytes) with every callback a no-op; _feed_limited then answers 431.
        def on_header(self, name: bytes, value: bytes) -> None:
            if self._head.field():
                super().on_header(name, value)

        def on_headers_complete(self) -> None:
            self._head.reading = False
            if self._head.refusal is not None:
                return
            self._deadline.headers_arrived()
            super().on_headers_complete()

        def on_body(self, body: bytes) -> None:
            if self._head.refusal is None:
                super().on_body(body)

        def on_message_complete(self) -> None:
            if self._head.refusal is not None:
                return
            self._head.next_request()
            super().on_message_complete()

        def on_response_complete(self) -> None:
            if not self.pipeline:  # a pipelined request's headers are in already
                self._deadline.arm(self.loop, timeout_s, self.transport)
            super().on_response_complete()

    return HttpToolsLimited
