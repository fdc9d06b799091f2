"""KV events on the wire (residency/vllm_client/kv_events.py) against vLLM's own code: batches
encoded by vLLM 0.32's `KVEventBatch` are decoded field for field, and the subscriber follows
vLLM's real `ZmqEventPublisher` (PUB + replay ROUTER, in this process, no engine): what was
published before it connected comes through the replay, later batches live, each once, in
order. The engine's events themselves are tested in test_kv_events_vllm.py."""

from __future__ import annotations

import asyncio
import time

import msgspec
import pytest

from residency.launcher import free_port
from residency.vllm_client.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    EventSource,
    KvEventsError,
    KvEventSubscriber,
    connect_address,
    decode_batch,
    sources_from,
)

kv = pytest.importorskip("vllm.distributed.kv_events", reason="vLLM's own encoder is the oracle")
H1, H2, H3 = b"\x01" * 32, b"\x02" * 32, b"\x03" * 32


def _vllm_batch(ts: float) -> object:
    return kv.KVEventBatch(
        ts=ts,
        events=[
            kv.BlockStored(
                block_hashes=[H1, H2],
                parent_block_hash=None,
                token_ids=list(range(32)),
                block_size=16,
                lora_id=None,
                medium="GPU",
                lora_name=None,
                group_idx=0,
            ),
            kv.BlockStored(
                block_hashes=[H3],
                parent_block_hash=H2,
                token_ids=list(range(32, 48)),
                block_size=16,
                lora_id=None,
                medium="GPU",
                lora_name=None,
                extra_keys=[("salt",)],
            ),
            kv.BlockRemoved(block_hashes=[H1], medium="GPU", group_idx=1),
            kv.AllBlocksCleared(),
        ],
        data_parallel_rank=0,
    )


def test_a_batch_vllm_encodes_decodes_field_for_field() -> None:
    batch = decode_batch(7, msgspec.msgpack.encode(_vllm_batch(12.5)))
    assert batch.seq == 7
    assert batch.ts == 12.5
    assert batch.events == (
        BlockStored((H1, H2), None, tuple(range(32)), 16, 0, "GPU", keyed=False),
        BlockStored((H3,), H2, tuple(range(32, 48)), 16, None, "GPU", keyed=True),
        BlockRemoved((H1,), 1, "GPU"),
        AllBlocksCleared(),
    )


def test_the_array_layout_and_int_hashes_decode_too() -> None:
    # vLLM's example subscriber declares events array_like: tag first, then fields in order.
    raw = [1.0, [["BlockStored", [11, 12], None, [1, 2, 3, 4], 2, None], ["BlockRemoved", [11]]]]
    batch = decode_batch(0, msgspec.msgpack.encode(raw))
    assert batch.events == (
        BlockStored((11, 12), None, (1, 2, 3, 4), 2, None, None, keyed=False),
        BlockRemoved((11,), None, None),
    )


@pytest.mark.parametrize(
    "payload",
    [b"\xc1", msgspec.msgpack.encode({"ts": 1}), msgspec.msgpack.encode([1.0, [42]])],
    ids=["not-msgpack", "a-map", "an-event-that-is-a-number"],
)
def test_what_is_not_a_batch_is_refused(payload: bytes) -> None:
    with pytest.raises(KvEventsError):
        decode_batch(3, payload)


def test_kv_event_sources_become_addresses_to_connect_to() -> None:
    answer = {
        "0": {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": "tcp://*:5557",
            "replay_endpoint": "tcp://*:5558",
            "topic": "kv",
        },
        "1": {"enable_kv_cache_events": False, "publisher": "null", "endpoint": "tcp://*:5559"},
    }
    assert sources_from(answer, "http://10.1.2.3:8000") == [
        EventSource("tcp://10.1.2.3:5557", "tcp://10.1.2.3:5558", "kv")
    ]
    assert sources_from({}, "http://h:1") == []
    assert sources_from(None, "http://h:1") == []
    assert connect_address("tcp://127.0.0.1:9", "h") == "tcp://127.0.0.1:9"
    assert connect_address("ipc:///tmp/kv", "h") == "ipc:///tmp/kv"


def test_the_subscriber_replays_what_came_before_it_then_follows_live() -> None:
    pub_port, replay_port = free_port(), free_port()
    publisher = kv.ZmqEventPublisher(
        0, endpoint=f"tcp://*:{pub_port}", replay_endpoint=f"tcp://*:{replay_port}"
    )
    try:
        for ts in (1.0, 2.0, 3.0):  # before anyone listens: only the replay has them
            publisher.publish(_vllm_batch(ts))
        # publish() only queues: its thread sends and buffers. A replay that ran before the
        # thread got to batch 3 would miss it, and PUB would drop it (no SUB yet): wait.
        deadline = time.monotonic() + 60
        while len(publisher._buffer) < 3:  # vLLM's replay buffer
            assert time.monotonic() < deadline, "vLLM's publisher did not buffer 3 batches"
            time.sleep(0.01)
        asyncio.run(_follow(publisher, pub_port, replay_port))
    finally:
        publisher.shutdown()


async def _follow(publisher: object, pub_port: int, replay_port: int) -> None:
    got: list[EventBatch] = []
    source = EventSource(f"tcp://127.0.0.1:{pub_port}", f"tcp://127.0.0.1:{replay_port}", "")
    subscriber = KvEventSubscriber(source, got.append, lambda: None)
    task = asyncio.create_task(subscriber.run())
    try:
        await _until(lambda: len(got) >= 3, "the three batches published before connecting")
        assert [b.ts for b in got] == [1.0, 2.0, 3.0]
        assert subscriber.replayed == 3
        deadline = time.monotonic() + 60
        ts = 4.0
        while len(got) < 6:  # live ones (PUB drops what it sends before the SUB has joined)
            assert time.monotonic() < deadline, f"timed out waiting for live batches: {got}"
            publisher.publish(_vllm_batch(ts))  # type: ignore[attr-defined]
            ts += 1.0
            await asyncio.sleep(0.05)
        seqs = [b.seq for b in got]
        assert seqs == list(range(len(got)))  # every batch once, in order, gaps replayed
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def _until(condition: object, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)
