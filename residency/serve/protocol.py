"""uvicorn's h11 protocol with a header read timeout: a connection that has not sent a whole
request line and headers within --header-timeout of connecting (or of its last answer) is closed.
uvicorn bounds idle keep-alive connections but not a client trickling its headers (slowloris)."""

from __future__ import annotations

import asyncio

from uvicorn.protocols.http.h11_impl import H11Protocol


def header_timeout_protocol(header_timeout_s: float) -> type[H11Protocol]:
    """An `H11Protocol` subclass (for `uvicorn.Config(http=...)`) closing slow-header clients."""

    class HeaderTimeoutProtocol(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None
        _requests_seen = 0

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def handle_events(self) -> None:
            cycle = self.cycle
            super().handle_events()
            if self.cycle is not cycle:  # a whole request line and headers arrived
                self._requests_seen += 1
                self._disarm()

        def on_response_complete(self) -> None:
            self._arm()  # before a pipelined request's headers are handled (they disarm it)
            super().on_response_complete()

        def _arm(self) -> None:
            self._disarm()
            self._header_timer = self.loop.call_later(
                header_timeout_s, self._expire, self._requests_seen
            )

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _expire(self, seen: int) -> None:
            if seen == self._requests_seen and not self.transport.is_closing():
                self.transport.close()

    return HeaderTimeoutProtocol
