"""The drain's races (residency/serve/drain.py) on real coroutines: a stream that has started
ends with DrainExpiredError at the deadline (the router then sends an error event and [DONE]),
work done first is returned untouched, and work still running at the deadline is cancelled."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from residency.serve.drain import DrainExpiredError, before_expiry, first_done, until_expired


async def one_then_silence(gate: asyncio.Event) -> AsyncIterator[bytes]:
    yield b"data: first\n\n"
    await gate.wait()  # an upstream that stalls mid-stream
    yield b"data: never\n\n"


def test_a_started_stream_ends_at_the_deadline() -> None:
    async def run() -> list[bytes]:
        expired, got = asyncio.Event(), []
        asyncio.get_running_loop().call_later(0.2, expired.set)

        async def read() -> None:
            async for chunk in until_expired(one_then_silence(asyncio.Event()), expired):
                got.append(chunk)

        with pytest.raises(DrainExpiredError):
            await read()
        return got

    assert asyncio.run(run()) == [b"data: first\n\n"]


def test_a_stream_that_ends_first_is_passed_whole() -> None:
    async def run() -> list[bytes]:
        gate, expired = asyncio.Event(), asyncio.Event()
        gate.set()
        return [c async for c in until_expired(one_then_silence(gate), expired)]

    assert asyncio.run(run()) == [b"data: first\n\n", b"data: never\n\n"]


def test_work_done_first_is_returned_and_late_work_cancelled() -> None:
    async def run() -> None:
        expired = asyncio.Event()
        assert await before_expiry(asyncio.sleep(0, result=7), expired) == 7
        quick = asyncio.ensure_future(asyncio.sleep(0, result="a"))
        slow = asyncio.ensure_future(asyncio.sleep(60))
        assert await first_done({quick, slow}, expired) == {quick}
        slow.cancel()
        late = asyncio.ensure_future(asyncio.sleep(60))
        asyncio.get_running_loop().call_later(0.1, expired.set)
        with pytest.raises(DrainExpiredError):
            await first_done({late}, expired)
        await asyncio.sleep(0)
        assert late.cancelled()
        with pytest.raises(DrainExpiredError):
            await before_expiry(asyncio.sleep(60), expired)

    asyncio.run(run())
