"""vLLM's KV-cache events: the ZMQ subscriber with gap replay, and where a server publishes them.
Decides nothing.

vLLM 0.32 (`vllm/distributed/kv_events.py`, `--kv-events-config '{"enable_kv_cache_events":
true, "publisher": "zmq", "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558"}'`)
publishes every engine step's events on a PUB socket as three frames: the topic, an 8-byte
big-endian sequence number, and a msgpack `KVEventBatch` (decoded in kv_wire.py, whose names
are importable from here too). The ROUTER socket at the replay endpoint answers a request frame
holding a start sequence number (8 bytes, big-endian) with every buffered batch from it on, as
(topic, seq, payload), then an end marker whose seq is -1.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from residency.vllm_client.kv_wire import (
    AllBlocksCleared,
    BlockHash,
    BlockRemoved,
    BlockStored,
    EventBatch,
    KvEvent,
    KvEventsError,
    decode_batch,
)

__all__ = [  # the wire's names stay importable from here
    "AllBlocksCleared",
    "BlockHash",
    "BlockRemoved",
    "BlockStored",
    "EventBatch",
    "EventSource",
    "KvEvent",
    "KvEventSubscriber",
    "KvEventsError",
    "connect_address",
    "decode_batch",
    "first_source",
    "sources_from",
    "stop_task",
]

log = logging.getLogger("residency.kv_events")

END_SEQ = -1
REPLAY_TIMEOUT_S = 10.0
# A sequence number this far below the last one means a new publisher, not a late copy.
RESTART_GAP = 1000
# The largest message read (ZMQ_MAXMSGSIZE). One engine step's batch holds its new blocks: a
# 32K-token prefill with 16-token blocks is 2,048 hashes (32 B each) and 32,768 token ids,
# about 170 KB of msgpack; 4 MiB is some 25 of those in one step.
MAX_MESSAGE_BYTES = 4 * 1024 * 1024
RCV_HWM = 64  # messages ZMQ queues unread: at most RCV_HWM * max_bytes buffered
BAD_LOG_EVERY_S = 60.0  # a kind of bad batch is logged at most once per this
DUTY_IDLE = 1.0  # after each batch, idle this many times the time it took to apply ...
MAX_IDLE_S = 0.1  # ... at most this long


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


class BadBatchLog:
    """Logs refused batches once per kind, then at most once per `every_s` per kind with the
    number refused meanwhile: a publisher sending garbage on every step must not flood the
    router's log."""

    def __init__(self, where: str, every_s: float = BAD_LOG_EVERY_S) -> None:
        self._where = where
        self._every_s = every_s
        self._last: dict[str, float] = {}
        self._since: dict[str, int] = {}

    def __call__(self, kind: str, message: str) -> None:
        now = time.monotonic()
        last = self._last.get(kind)
        if last is not None and now - last < self._every_s:
            self._since[kind] = self._since.get(kind, 0) + 1
            return
        more = self._since.pop(kind, 0)
        also = f" ({more} more of this kind since the last report)" if more else ""
        log.warning("KV events %s: skipped a bad batch: %s%s", self._where, message, also)
        self._last[kind] = now


class KvEventSubscriber:
    """Follows one publisher: replays its buffer first (what was cached before we listened),
    then reads batches as they come, replaying any gap in the sequence numbers. `on_batch`
    gets every batch once, in order (it may be a coroutine function: it is awaited);
    `on_reset` is called when the sequence starts over (the publisher restarted: whatever was
    known of its cache is void).

    The stream is untrusted input: a message larger than `max_bytes` is dropped by ZMQ itself
    (MAXMSGSIZE: the connection is closed and made again), a malformed one is counted through
    `on_bad(kind)`, logged (rate-limited) and skipped, and nothing a publisher sends ends the
    subscription. Payloads are decoded in a worker thread, off the event loop."""

    def __init__(
        self,
        source: EventSource,
        on_batch: Callable[[EventBatch], object],
        on_reset: Callable[[], None],
        on_bad: Callable[[str], None] | None = None,
        max_bytes: int = MAX_MESSAGE_BYTES,
    ) -> None:
        self.source = source
        self._on_batch = on_batch
        self._on_reset = on_reset
        self._on_bad = on_bad
        self._max_bytes = max_bytes
        self._log_bad = BadBatchLog(source.endpoint)
        self.last_seq: int | None = None
        self.batches = 0
        self.replayed = 0
        self.bad = 0

    def _socket(self, kind: int) -> Any:
        import zmq
        import zmq.asyncio

        sock = zmq.asyncio.Context.instance().socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, self._max_bytes)
        sock.setsockopt(zmq.RCVHWM, RCV_HWM)  # queued messages: memory <= RCV_HWM * max_bytes
        return sock

    async def run(self) -> None:
        """Subscribe and deliver batches until cancelled."""
        import zmq
        import zmq.asyncio
        from zmq.utils.monitor import parse_monitor_message

        sub, monitor = self._subscribe()
        try:
            await self._replay(0)  # what the buffer still holds: blocks cached before we came
            while True:
                poller = zmq.asyncio.Poller()
                poller.register(sub, zmq.POLLIN)
                poller.register(monitor, zmq.POLLIN)
                ready = dict(await poller.poll())
                if sub in ready:  # what is queued goes first: a disconnect comes after it
                    await self._read(sub)
                elif monitor in ready:
                    event = parse_monitor_message(await monitor.recv_multipart())
                    if event["event"] == zmq.EVENT_DISCONNECTED:
                        # ZMQ drops a message over MAXMSGSIZE by closing the connection, and
                        # does not connect again: a new socket does (gaps are replayed).
                        why = f"a message over {self._max_bytes} bytes, or the publisher left"
                        self._bad("disconnect", f"connection dropped ({why}); reconnecting")
                        self._close(sub, monitor)
                        sub, monitor = self._subscribe()
        finally:
            self._close(sub, monitor)

    async def _read(self, sub: Any) -> None:
        frames = await sub.recv_multipart()
        try:
            await self._receive(frames)
        except (asyncio.CancelledError, KeyboardInterrupt, SystemExit):
            raise
        except Exception as exc:  # whatever a message did, the next one is read
            self._bad("internal", f"{type(exc).__name__}: {exc}")

    def _subscribe(self) -> tuple[Any, Any]:
        import zmq

        sub = self._socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, self.source.topic.encode())
        monitor = sub.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        sub.connect(self.source.endpoint)
        return sub, monitor

    @staticmethod
    def _close(sub: Any, monitor: Any) -> None:
        sub.disable_monitor()
        monitor.close(linger=0)
        sub.close(linger=0)

    async def _receive(self, frames: list[bytes]) -> None:
        seq = self._seq(frames)
        if seq is None:
            return
        last = self.last_seq
        if last is not None and seq <= last:
            if last - seq <= RESTART_GAP:
                return  # already delivered by a replay (a restart that soon after its start
                # is caught when the router sees the upstream come back)
            self._restart()  # numbering started over: a new engine
            await self._replay(0)
            if self.last_seq is not None and seq <= self.last_seq:
                return
        elif last is not None and seq > last + 1:
            await self._replay(last + 1)
            if self.last_seq is not None and seq <= self.last_seq:
                return
        await self._deliver(seq, frames[2])

    def _seq(self, frames: Sequence[bytes]) -> int | None:
        """The message's sequence number: 8 bytes, not negative; None (counted) otherwise."""
        if len(frames) != 3:
            self._bad("frames", f"a message of {len(frames)} frames (expected 3)")
            return None
        if len(frames[1]) != 8:
            self._bad("seq", f"a sequence frame of {len(frames[1])} bytes (expected 8)")
            return None
        seq = int.from_bytes(frames[1], "big", signed=True)
        if seq < 0:
            self._bad("seq", f"sequence number {seq} is negative")
            return None
        return seq

    def _bad(self, kind: str, message: str) -> None:
        self.bad += 1
        if self._on_bad is not None:
            self._on_bad(kind)
        self._log_bad(kind, message)

    def _restart(self) -> None:
        log.info(
            "KV events %s: sequence restarted; the cache is unknown again", self.source.endpoint
        )
        self.last_seq = None
        self._on_reset()

    async def _deliver(self, seq: int, payload: bytes) -> None:
        self.last_seq = seq  # a bad batch is skipped, never asked for again
        if len(payload) > self._max_bytes:
            self._bad("size", f"batch {seq} of {len(payload)} bytes (limit {self._max_bytes})")
            return
        started = time.perf_counter()
        try:
            batch = await asyncio.to_thread(decode_batch, seq, payload)
        except KvEventsError as exc:
            self._bad(exc.kind, str(exc))
            return
        self.batches += 1
        try:
            done = self._on_batch(batch)
            if inspect.isawaitable(done):
                await done
        except (asyncio.CancelledError, KeyboardInterrupt, SystemExit):
            raise
        except Exception as exc:
            self._bad("apply", f"batch {seq}: {type(exc).__name__}: {exc}")
        finally:
            # The worker thread holds the GIL while it decodes and applies: as long again
            # idle, so a flood takes at most about half of the event loop's time (a batch of
            # vLLM's usual size costs well under a millisecond: no lag worth the name).
            spent = time.perf_counter() - started
            await asyncio.sleep(min(spent * DUTY_IDLE, MAX_IDLE_S))

    async def _replay(self, start: int) -> None:
        """Ask the replay endpoint for every batch from `start` (none: nothing to do)."""
        if self.source.replay_endpoint is None:
            return
        import zmq

        dealer = self._socket(zmq.DEALER)
        dealer.connect(self.source.replay_endpoint)
        try:
            await dealer.send_multipart((b"", max(start, 0).to_bytes(8, "big")))
            while True:
                frames = await asyncio.wait_for(dealer.recv_multipart(), REPLAY_TIMEOUT_S)
                frames = frames[1:] if frames and frames[0] == b"" else frames
                if len(frames) == 3 and frames[1] == END_SEQ.to_bytes(8, "big", signed=True):
                    return
                seq = self._seq(frames)
                if seq is not None and (self.last_seq is None or seq > self.last_seq):
                    self.replayed += 1
                    await self._deliver(seq, frames[2])
        except TimeoutError:
            log.warning(
                "KV events %s: replay from %d got no end marker in %g s",
                self.source.replay_endpoint,
                start,
                REPLAY_TIMEOUT_S,
            )
        except zmq.ZMQError as exc:
            self._bad("replay", f"replay from {start}: {exc}")
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
