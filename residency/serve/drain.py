"""Graceful shutdown: on SIGTERM the router says it is draining (/health answers 503
"draining") while it still serves, then stops accepting, lets the requests in flight finish
and, at --shutdown-timeout after the signal, ends those still running itself: a 503 in the
OpenAI error shape for an answer not yet started, an error event and [DONE] for a stream. Every
one of them is logged (query-log line included) and none ends in a traceback: uvicorn's own
timeout, which cancels handlers mid-flight, is set past ours (SHUTDOWN_GRACE_S).

The default --shutdown-timeout (60 s) covers a 32K-token prompt on the hosts the plans target:
vLLM prefills an 8B model at roughly 5-10K tokens/s on one H100 (3-7 s for 32K tokens) and a
1.7B model at about 1-2K tokens/s on 16 CPU cores with AVX-512 (16-30 s); the rest is the
answer's decode. On slower hosts raise it with the request timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator, Awaitable
from types import FrameType
from typing import Any, TypeVar

from starlette.responses import Response

from residency.serve.errors import error_response

ANNOUNCE_S = 2.0  # draining said at /health for this long (at most half the timeout) first
SHUTDOWN_GRACE_S = 5.0  # uvicorn's own deadline is this far past ours
T = TypeVar("T")


class Drain:
    """The shutdown state requests and /health read: draining, and the deadline's event."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.draining = False
        self.expired = asyncio.Event()

    def begin(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start draining now; the deadline fires `timeout_s` from now."""
        self.draining = True
        loop.call_later(self.timeout_s, self.expired.set)

    @property
    def announce_s(self) -> float:
        """How long the router keeps accepting while it reports itself draining."""
        return min(ANNOUNCE_S, self.timeout_s / 2)


def draining_server(config: Any, drain: Drain) -> Any:
    """A uvicorn server whose first SIGTERM drains (see the module docstring); a second
    signal, or SIGINT, stops it as uvicorn does."""
    import uvicorn

    class DrainingServer(uvicorn.Server):
        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            if sig != signal.SIGTERM or drain.draining:
                super().handle_exit(sig, frame)
                return
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # not serving yet: nothing to drain
                super().handle_exit(sig, frame)
                return
            loop.call_soon_threadsafe(self._drain, loop, sig)

        def _drain(self, loop: asyncio.AbstractEventLoop, sig: int) -> None:
            drain.begin(loop)
            loop.call_later(drain.announce_s, super().handle_exit, sig, None)

    return DrainingServer(config)


class DrainExpiredError(Exception):
    """--shutdown-timeout passed with the request still running."""


async def until_expired(
    chunks: AsyncIterator[bytes], expired: asyncio.Event
) -> AsyncIterator[bytes]:
    """`chunks` until `expired` is set (then DrainExpiredError)."""
    iterator = aiter(chunks)
    stop = asyncio.ensure_future(expired.wait())
    try:
        while True:
            step = asyncio.ensure_future(anext(iterator))
            done, _ = await asyncio.wait({step, stop}, return_when=asyncio.FIRST_COMPLETED)
            if step not in done:
                step.cancel()
                with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                    await step
                raise DrainExpiredError
            try:
                yield step.result()
            except StopAsyncIteration:
                return
    finally:
        stop.cancel()


async def first_done(
    work: set[asyncio.Future[Any]], expired: asyncio.Event
) -> set[asyncio.Future[Any]]:
    """The futures of `work` done first, unless `expired` is set before (then every one is
    cancelled, and DrainExpiredError)."""
    stop = asyncio.ensure_future(expired.wait())
    try:
        done, _ = await asyncio.wait({*work, stop}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stop.cancel()
    if done <= {stop}:
        for future in work:
            future.cancel()
        raise DrainExpiredError
    return done - {stop}


async def before_expiry(work: Awaitable[T], expired: asyncio.Event) -> T:
    """`work`'s result, unless `expired` is set first (then it is cancelled, and
    DrainExpiredError)."""
    task = asyncio.ensure_future(work)
    stop = asyncio.ensure_future(expired.wait())
    try:
        done, _ = await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stop.cancel()
    if task not in done:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        raise DrainExpiredError
    return task.result()


def shutting_down() -> Response:
    """The 503 a request still running at --shutdown-timeout gets."""
    return error_response(
        503,
        "the router is shutting down; retry the request",
        "service_unavailable",
        "shutting_down",
    )
