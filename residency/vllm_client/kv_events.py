"""vLLM's KV-cache events: the wire format and a ZMQ subscriber with gap replay. Decides nothing.

vLLM 0.32 (`vllm/distributed/kv_events.py`, `--kv-events-config '{"enable_kv_cache_events":
true, "publisher": "zmq", "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558"}'`)
publishes every engine step's events on a PUB socket as three frames: the topic, an 8-byte
big-endian sequence number, and a msgpack `KVEventBatch` encoded by msgspec —
`[ts, [event, ...], data_parallel_rank]`, each event a map tagged by its class name:

    {"type": "BlockStored", "block_hashes": [h, ...], "parent_block_hash": h | None,
     "token_ids": [...], "block_size": 16, "lora_id": None, "medium": "GPU", "group_idx": 0}
    {"type": "BlockRemoved", "block_hashes": [h, ...], "medium": "GPU", "group_idx": 0}
    {"type": "AllBlocksCleared"}

A hash is 32 sha256 bytes (an int with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES). Fields left at
their defaults are omitted (`omit_defaults`), and older layouts encoded an event as an array
(tag first, then the fields in order): both are read. The ROUTER socket at the replay endpoint
answers a request frame holding a start sequence number (8 bytes, big-endian) with every
buffered batch from it on, as (topic, seq, payload), then an end marker whose seq is -1.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

log = logging.getLogger("residency.kv_events")

BlockHash = bytes | int
END_SEQ = -1
REPLAY_TIMEOUT_S = 10.0
# A sequence number this far below the last one means a new publisher, not a late copy.
RESTART_GAP = 1000
# Field order of the array layout (vLLM's example subscriber declares events array_like).
_STORED_FIELDS = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id")
_REMOVED_FIELDS = ("block_hashes", "medium")


class KvEventsError(Exception):
    """A payload that is not a KV event batch, or a replay that did not answer."""


@dataclass(frozen=True, slots=True)
class BlockStored:
    """Full blocks newly cached (or, with kv_cache_report_mode "full", found cached): the
    hashes in chain order, the first block's parent, and the token ids they hold."""

    block_hashes: tuple[BlockHash, ...]
    parent_block_hash: BlockHash | None
    token_ids: tuple[int, ...]
    block_size: int
    group_idx: int | None
    medium: str | None
    keyed: bool  # LoRA or extra keys in the hash: its blocks are not the tokens alone


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    """Blocks whose hashes left the prefix cache (evicted or replaced)."""

    block_hashes: tuple[BlockHash, ...]
    group_idx: int | None
    medium: str | None


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    """The whole prefix cache was reset (`/reset_prefix_cache`, sleep)."""


KvEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True, slots=True)
class EventBatch:
    """One published batch: its sequence number, the engine's timestamp and its events."""

    seq: int
    ts: float
    events: tuple[KvEvent, ...]


def decode_batch(seq: int, payload: bytes) -> EventBatch:
    """The batch in one payload; `KvEventsError` when it is not one."""
    import msgspec

    try:
        raw = msgspec.msgpack.decode(payload)
    except msgspec.DecodeError as exc:
        raise KvEventsError(f"KV event batch {seq}: not msgpack ({exc})") from None
    if not isinstance(raw, list | tuple) or len(raw) < 2 or not isinstance(raw[1], list):
        raise KvEventsError(f"KV event batch {seq}: expected [ts, [events...], ...]")
    events = tuple(e for e in (_event(x) for x in raw[1]) if e is not None)
    return EventBatch(seq, float(raw[0]), events)


def _event(raw: Any) -> KvEvent | None:
    """One event from its map (or array) form; an unknown kind is skipped (None)."""
    if isinstance(raw, list | tuple) and raw and isinstance(raw[0], str):
        kind = raw[0]
        names = _STORED_FIELDS if kind == "BlockStored" else _REMOVED_FIELDS
        fields: dict[str, Any] = dict(zip(names, raw[1:], strict=False))
    elif isinstance(raw, dict):
        kind, fields = str(raw.get("type", "")), raw
    else:
        raise KvEventsError(f"KV event {raw!r:.80}: neither a map nor an array")
    if kind == "AllBlocksCleared":
        return AllBlocksCleared()
    hashes = tuple(_hash(h) for h in fields.get("block_hashes") or ())
    if kind == "BlockRemoved":
        return BlockRemoved(hashes, fields.get("group_idx"), fields.get("medium"))
    if kind == "BlockStored":
        parent = fields.get("parent_block_hash")
        extra = fields.get("extra_keys")
        keyed = bool(fields.get("lora_name") or fields.get("lora_id")) or bool(
            extra and any(k for k in extra)
        )
        return BlockStored(
            block_hashes=hashes,
            parent_block_hash=None if parent is None else _hash(parent),
            token_ids=tuple(int(t) for t in fields.get("token_ids") or ()),
            block_size=int(fields.get("block_size") or 0),
            group_idx=fields.get("group_idx"),
            medium=fields.get("medium"),
            keyed=keyed,
        )
    return None


def _hash(value: Any) -> BlockHash:
    if isinstance(value, bytes | int):
        return value
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    raise KvEventsError(f"block hash {value!r:.80} is neither bytes nor an int")


@dataclass(frozen=True, slots=True)
class EventSource:
    """Where one vLLM data-parallel rank publishes: its PUB and replay endpoints, to connect to."""

    endpoint: str
    replay_endpoint: str | None
    topic: str


def sources_from(answer: Any, server_url: str) -> list[EventSource]:
    """The ZMQ publishers in vLLM's `GET /kv_event_sources` answer (`{rank: KVEventsConfig}`),
    as addresses to connect to: a wildcard bind (`tcp://*:5557`) becomes the server's host."""
    if not isinstance(answer, dict):
        return []
    host = urlsplit(server_url).hostname or "127.0.0.1"
    found: list[EventSource] = []
    for _, config in sorted(answer.items(), key=lambda kv: str(kv[0])):
        if not isinstance(config, dict) or not config.get("enable_kv_cache_events"):
            continue
        if config.get("publisher") != "zmq" or not config.get("endpoint"):
            continue
        replay = config.get("replay_endpoint")
        found.append(
            EventSource(
                endpoint=connect_address(str(config["endpoint"]), host),
                replay_endpoint=connect_address(str(replay), host) if replay else None,
                topic=str(config.get("topic") or ""),
            )
        )
    return found


def connect_address(endpoint: str, host: str) -> str:
    """The address a subscriber connects to for a publisher's bind address.

    >>> connect_address("tcp://*:5557", "10.0.0.7")
    'tcp://10.0.0.7:5557'
    >>> connect_address("tcp://0.0.0.0:5557", "::1")
    'tcp://[::1]:5557'
    """
    scheme, _, rest = endpoint.partition("://")
    if scheme != "tcp":
        return endpoint
    bound, _, port = rest.rpartition(":")
    if bound in ("*", "0.0.0.0", "[::]", "::"):
        bound = f"[{host}]" if ":" in host else host
    return f"tcp://{bound}:{port}"


class KvEventSubscriber:
    """Follows one publisher: replays its buffer first (what was cached before we listened),
    then reads batches as they come, replaying any gap in the sequence numbers. `on_batch`
    gets every batch once, in order; `on_reset` is called when the sequence starts over (the
    publisher restarted: whatever was known of its cache is void)."""

    def __init__(
        self,
        source: EventSource,
        on_batch: Callable[[EventBatch], None],
        on_reset: Callable[[], None],
    ) -> None:
        self.source = source
        self._on_batch = on_batch
        self._on_reset = on_reset
        self.last_seq: int | None = None
        self.batches = 0
        self.replayed = 0

    async def run(self) -> None:
        """Subscribe and deliver batches until cancelled."""
        import zmq
        import zmq.asyncio

        ctx = zmq.asyncio.Context.instance()
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, self.source.topic.encode())
        sub.setsockopt(zmq.LINGER, 0)
        sub.connect(self.source.endpoint)
        try:
            await self._replay(0)  # what the buffer still holds: blocks cached before we came
            while True:
                frames = await sub.recv_multipart()
                if len(frames) != 3:
                    log.warning("KV events %s: a message of %d frames", self.source.endpoint,
                                len(frames))  # fmt: skip
                    continue
                seq = int.from_bytes(frames[1], "big", signed=True)
                last = self.last_seq
                if last is not None and seq <= last:
                    if last - seq <= RESTART_GAP:
                        continue  # already delivered by a replay (a restart that soon after
                        # its start is caught when the router sees the upstream come back)
                    self._restart()  # numbering started over: a new engine
                    await self._replay(0)
                    if self.last_seq is not None and seq <= self.last_seq:
                        continue
                elif last is not None and seq > last + 1:
                    await self._replay(last + 1)
                    if self.last_seq is not None and seq <= self.last_seq:
                        continue
                self._deliver(seq, frames[2])
        finally:
            sub.close(linger=0)

    def _restart(self) -> None:
        log.info("KV events %s: sequence restarted; the cache is unknown again",
                 self.source.endpoint)  # fmt: skip
        self.last_seq = None
        self._on_reset()

    def _deliver(self, seq: int, payload: bytes) -> None:
        try:
            batch = decode_batch(seq, payload)
        except KvEventsError as exc:
            log.warning("KV events %s: %s", self.source.endpoint, exc)
            self.last_seq = seq
            return
        self.last_seq = seq
        self.batches += 1
        self._on_batch(batch)

    async def _replay(self, start: int) -> None:
        """Ask the replay endpoint for every batch from `start` (none: nothing to do)."""
        if self.source.replay_endpoint is None:
            return
        import zmq
        import zmq.asyncio

        ctx = zmq.asyncio.Context.instance()
        dealer = ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(self.source.replay_endpoint)
        try:
            await dealer.send_multipart((b"", start.to_bytes(8, "big")))
            while True:
                frames = await asyncio.wait_for(dealer.recv_multipart(), REPLAY_TIMEOUT_S)
                frames = frames[1:] if frames and frames[0] == b"" else frames
                if len(frames) != 3:
                    continue
                seq = int.from_bytes(frames[1], "big", signed=True)
                if seq == END_SEQ:
                    return
                if self.last_seq is None or seq > self.last_seq:
                    self.replayed += 1
                    self._deliver(seq, frames[2])
        except TimeoutError:
            log.warning("KV events %s: replay from %d got no end marker in %g s",
                        self.source.replay_endpoint, start, REPLAY_TIMEOUT_S)  # fmt: skip
        finally:
            dealer.close(linger=0)


async def stop_task(task: asyncio.Task[None] | None) -> None:
    """Cancel a subscriber's task and wait for it to end."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task


def first_source(sources: Sequence[EventSource]) -> EventSource | None:
    """The rank-0 publisher (the router talks to one engine per --upstream)."""
    return sources[0] if sources else None
