"""uvicorn's HTTP protocols with a header read timeout: a connection that has not sent a whole
request line and headers within --header-timeout of connecting (or of its last answer) is
closed. uvicorn bounds idle keep-alive connections, not a client trickling its headers
(slowloris). httptools is used when installed (vLLM installs it), as uvicorn's "auto" does."""

from __future__ import annotations

import asyncio
import importlib.util
from typing import Literal

from uvicorn.protocols.http.h11_impl import H11Protocol


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


def header_timeout_protocol(
    header_timeout_s: float, http: Literal["auto", "h11"] = "auto"
) -> type[asyncio.Protocol]:
    """A protocol class for `uvicorn.Config(http=...)` that closes slow-header clients
    (`http`: as uvicorn's option, auto = httptools when installed)."""
    if http == "auto" and importlib.util.find_spec("httptools") is not None:
        return _httptools_protocol(header_timeout_s)

    class H11HeaderTimeout(H11Protocol):
        _deadline: _Deadline

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._deadline = _Deadline()
            self._deadline.arm(self.loop, header_timeout_s, transport)

        def connection_lost(self, exc: Exception | None) -> None:
            self._deadline.disarm()
            super().connection_lost(exc)

        def handle_events(self) -> None:
            cycle = self.cycle
            super().handle_events()
            if self.cycle is not cycle:  # a whole request line and headers arrived
                self._deadline.headers_arrived()

        def on_response_complete(self) -> None:
            self._deadline.arm(self.loop, header_timeout_s, self.transport)  # before pipelined
            super().on_response_complete()

    return H11HeaderTimeout


def _httptools_protocol(header_timeout_s: float) -> type[asyncio.Protocol]:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class HttpToolsHeaderTimeout(HttpToolsProtocol):
        _deadline: _Deadline

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._deadline = _Deadline()
            self._deadline.arm(self.loop, header_timeout_s, transport)

        def connection_lost(self, exc: Exception | None) -> None:
            self._deadline.disarm()
            super().connection_lost(exc)

        def on_headers_complete(self) -> None:
            self._deadline.headers_arrived()
            super().on_headers_complete()

        def on_response_complete(self) -> None:
            if not self.pipeline:  # a pipelined request's headers are in already
                self._deadline.arm(self.loop, header_timeout_s, self.transport)
            super().on_response_complete()

    return HttpToolsHeaderTimeout
