"""The KV-event stream as untrusted input (issue 42): every malformed batch the issue found
ending the subscription is refused by `decode_batch` with a counted kind, a fake ZMQ publisher
(PUB + replay ROUTER, pyzmq, no engine) sends them live and from its replay buffer and the
subscriber keeps delivering the good batches after them, and a seeded fuzz of 10,000 random and
mutated batches over the wire ends no subscription."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import msgspec
import pytest
import zmq

from residency.keep.block_index import BlockIndex, Chain
from residency.launcher import free_port
from residency.vllm_client.kv_events import (
    EventBatch,
    EventSource,
    KvEventsError,
    KvEventSubscriber,
    decode_batch,
)

H = b"\x01" * 32


def good(ts: float = 1.0) -> bytes:
    event = {
        "type": "BlockStored",
        "block_hashes": [H],
        "parent_block_hash": None,
        "token_ids": list(range(16)),
        "block_size": 16,
        "group_idx": 0,
    }
    return msgspec.msgpack.encode([ts, [event], 0])


def stored(**fields: Any) -> bytes:
    event = {
        "type": "BlockStored",
        "block_hashes": [H],
        "token_ids": list(range(16)),
        "block_size": 16,
    } | fields
    return msgspec.msgpack.encode([1.0, [event], 0])


# The issue's reproductions, each of which ended the subscription for good.
BAD = {
    "ts-a-string": msgspec.msgpack.encode(["abc", [], 0]),
    "ts-none": msgspec.msgpack.encode([None, [], 0]),
    "group-idx-a-list": stored(group_idx=[1]),
    "token-ids-a-string": stored(token_ids="abc"),
    "block-size-a-string": stored(block_size="x"),
    "block-hashes-an-int": stored(block_hashes=5),
    "extra-keys-an-int": stored(extra_keys=7),
    "array-event-hashes-an-int": msgspec.msgpack.encode([1.0, [["BlockStored", 5]], 0]),
    "removed-medium-a-map": msgspec.msgpack.encode(
        [1.0, [{"type": "BlockRemoved", "block_hashes": [H], "medium": {}}], 0]
    ),
    "parent-a-float": stored(parent_block_hash=1.5),
    "token-ids-bools": stored(token_ids=[True] * 16),
}


@pytest.mark.parametrize("payload", list(BAD.values()), ids=list(BAD))
def test_each_malformed_batch_the_issue_found_is_refused_with_a_kind(payload: bytes) -> None:
    with pytest.raises(KvEventsError) as caught:
        decode_batch(3, payload)
    assert caught.value.kind in {"ts", "field", "event"}


class FakePublisher:
    """vLLM's wire (PUB: topic, 8-byte seq, payload; replay ROUTER answering a start seq with
    its buffer and an end marker), sending whatever a test gives it."""

    def __init__(self, buffer: list[tuple[bytes, bytes]]) -> None:
        self.ctx = zmq.Context()
        self.pub_port, self.replay_port = free_port(), free_port()
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.bind(f"tcp://127.0.0.1:{self.pub_port}")
        self.buffer = buffer  # (seq frame, payload), replayed from any start
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve_replay, daemon=True)
        self._thread.start()

    @property
    def source(self) -> EventSource:
        return EventSource(
            f"tcp://127.0.0.1:{self.pub_port}", f"tcp://127.0.0.1:{self.replay_port}", ""
        )

    def send(self, seq: bytes, payload: bytes, frames: int = 3) -> None:
        self.pub.send_multipart([b"", seq, payload][:frames] + [b"x"] * (frames - 3))

    def _serve_replay(self) -> None:
        router = self.ctx.socket(zmq.ROUTER)
        router.bind(f"tcp://127.0.0.1:{self.replay_port}")
        router.setsockopt(zmq.RCVTIMEO, 100)
        while not self._stop.is_set():
            try:
                ident, _, _ = router.recv_multipart()
            except zmq.Again:
                continue
            for seq, payload in self.buffer:
                router.send_multipart([ident, b"", b"", seq, payload])
            router.send_multipart([ident, b"", b"", (-1).to_bytes(8, "big", signed=True), b""])
        router.close(linger=0)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.pub.close(linger=0)
        self.ctx.term()


def seq(n: int) -> bytes:
    return n.to_bytes(8, "big", signed=True)


async def _until(
    check: Callable[[], bool], what: str, poke: Callable[[], None] = lambda: None
) -> None:
    deadline = time.monotonic() + 60
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        poke()
        await asyncio.sleep(0.02)


@pytest.fixture
def publisher() -> Iterator[FakePublisher]:
    # The replay buffer itself holds a bad batch: it used to end the task on every rejoin.
    pub = FakePublisher([(seq(0), BAD["ts-a-string"]), (seq(1), good(1.0))])
    yield pub
    pub.close()


def test_bad_batches_live_and_replayed_are_counted_and_skipped_and_the_stream_goes_on(
    publisher: FakePublisher,
) -> None:
    async def follow() -> None:
        got: list[EventBatch] = []
        kinds: list[str] = []
        sub = KvEventSubscriber(
            publisher.source, got.append, lambda: None, on_bad=kinds.append, max_bytes=65_536
        )
        task = asyncio.create_task(sub.run())
        try:
            await _until(lambda: [b.seq for b in got] == [1], "the replayed good batch")
            assert kinds == ["ts"]
            n = [2]

            def resend(ts: float) -> Callable[[], None]:
                def send() -> None:  # a later seq each time, so none is a duplicate
                    publisher.send(seq(n[0]), good(ts))
                    n[0] += 1

                return send

            # PUB drops what it sends before the SUB has joined: a good batch through first
            await _until(lambda: got[-1].ts == 2.0, "a live batch", resend(2.0))
            for payload in BAD.values():
                publisher.send(seq(n[0]), payload)
                n[0] += 1
            publisher.send(seq(n[0]).rjust(16, b"\0"), good())  # a 16-byte sequence frame
            publisher.send(seq(-5000), good())  # negative: its replay start overflowed
            publisher.send(seq(n[0]), good(), frames=4)
            publisher.send(seq(n[0]), b"\0" * 100_000)  # over max_bytes: ZMQ disconnects
            await _until(lambda: got[-1].ts == 9.0, "a good batch after the bad ones", resend(9.0))
            assert not task.done()
            assert {"ts", "field", "seq", "frames", "disconnect"} <= set(kinds)
        finally:
            task.cancel()

    asyncio.run(follow())


def _random_value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(9 if depth < 3 else 6)
    if kind == 0:
        return None
    if kind == 1:
        return rng.choice([True, False])
    if kind == 2:
        return rng.randint(-(2**63), 2**64 - 1)
    if kind == 3:
        return rng.random() * 1e9
    if kind == 4:
        return rng.randbytes(rng.choice([0, 8, 32, 33]))
    if kind == 5:
        return rng.choice(["BlockStored", "BlockRemoved", "AllBlocksCleared", "", "x" * 40])
    if kind == 6:
        return [_random_value(rng, depth + 1) for _ in range(rng.randrange(5))]
    keys = [
        "type",
        "block_hashes",
        "parent_block_hash",
        "token_ids",
        "block_size",
        "group_idx",
        "medium",
        "extra_keys",
        "lora_id",
        "lora_name",
        7,
    ]
    return {rng.choice(keys): _random_value(rng, depth + 1) for _ in range(rng.randrange(6))}


def fuzz_batches(n: int, seed: int = 42) -> Iterator[bytes]:
    """Random batches (random msgpack shaped like one) and mutations of good ones (a field's
    value replaced, bytes flipped, the payload cut short)."""
    rng = random.Random(seed)
    for i in range(n):
        way = i % 4
        if way == 0:
            yield msgspec.msgpack.encode([_random_value(rng), [_random_value(rng)], 0])
        elif way == 1:
            event = msgspec.msgpack.decode(good())[1][0]
            event[rng.choice(list(event))] = _random_value(rng)
            yield msgspec.msgpack.encode([1.0, [event], 0])
        elif way == 2:
            flipped = bytearray(good())
            for _ in range(rng.randrange(1, 4)):
                flipped[rng.randrange(len(flipped))] = rng.randrange(256)
            yield bytes(flipped)
        else:
            data = good()
            yield data[: rng.randrange(len(data))]


def test_ten_thousand_fuzzed_batches_raise_only_kv_events_errors_and_apply_cleanly() -> None:
    index = BlockIndex()
    index.set_prefixes([Chain("p", tuple(range(33)))])
    refused = 0
    for n, payload in enumerate(fuzz_batches(10_000)):
        try:
            batch = decode_batch(n, payload)
        except KvEventsError:
            refused += 1
            continue
        index.apply(batch.events)  # what decodes must apply without raising
    assert 1_000 < refused < 10_000  # both branches exercised


def test_a_fuzzed_stream_of_ten_thousand_batches_ends_no_subscription() -> None:
    pub = FakePublisher([])

    async def follow() -> None:
        got: list[EventBatch] = []
        kinds: list[str] = []
        index = BlockIndex()

        def apply(batch: EventBatch) -> None:
            got.append(batch)
            index.apply(batch.events)

        sub = KvEventSubscriber(pub.source, apply, lambda: None, on_bad=kinds.append)
        task = asyncio.create_task(sub.run())
        try:
            await _until(
                lambda: bool(got), "the subscriber to join", lambda: pub.send(seq(0), good(0.5))
            )
            for n, payload in enumerate(fuzz_batches(10_000), start=1):
                pub.send(seq(n), payload)
                if n % 200 == 0:
                    await asyncio.sleep(0.01)  # PUB drops past its high-water mark
            sentinel = [10_001]

            def resend() -> None:
                pub.send(seq(sentinel[0]), good(7.0))
                sentinel[0] += 1

            await _until(lambda: got[-1].ts == 7.0, "a good batch after the fuzz", resend)
            assert not task.done()
            assert len(kinds) > 1_000
        finally:
            task.cancel()

    try:
        asyncio.run(follow())
    finally:
        pub.close()
