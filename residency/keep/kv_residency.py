"""Residency from the engine: each upstream's KV events (residency/vllm_client/kv_events.py)
fed into a `BlockIndex`, every planned prefix's resident blocks in metrics, and a re-warm of a
prefix as soon as vLLM reports its blocks evicted.

An upstream is in events mode once `GET /kv_event_sources` lists a ZMQ publisher; the router
then subscribes (replaying the publisher's buffer first), renders each prefix's shared prompt
through the upstream's `/tokenize` (the token ids warm sends) and matches it against the stored
blocks. A prefix whose blocks were cached before the router listened is learned with one probe
carrying `vllm_xargs: {"kv_cache_report_mode": "full"}`, which makes vLLM publish the blocks a
request found cached (vllm/v1/core/kv_cache_manager.py). Elsewhere keep-warm's token count
stays in charge (residency/keep/token_count.py), and the log says which mode each upstream runs.

Every batch that removes a resident block of a prefix (`BlockStored` then `BlockRemoved` in one
batch included: a re-warm's own blocks evicted again) schedules a re-warm unless one is waiting or
under way. A re-warm sends the prefix's warm prompt (token ids, `max_tokens` 1): the evicted blocks
are prefilled again and the rest move to the young end of the LRU queue. One request carries every
prompt due on that upstream: the other prefixes waiting for a re-warm and, once per burst of
evictions, the planned prefixes still whole there (`_refresh` says why), as one completions
request with a list of prompts. It waits for the router's
requests in flight on that upstream to finish (they allocate blocks and would evict it again; at
most REWARM_MAX_DEFER_S), and for --rewarm-interval since the prefix's last re-warm, whatever
its reason (an eviction, a cleared cache, a restarted engine, learning). A request routed to a
prefix with a re-warm waiting skips the other waits and waits for that re-warm instead of
prefilling the prefix itself, at most --rewarm-wait seconds (then it goes and prefills what is
missing): a flood of restarts or clears costs one re-warm per interval and delays no request
longer than that bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

import anyio

from residency.errors import ResidencyError
from residency.keep.agent_metrics import AgentMetrics
from residency.keep.block_index import BlockIndex, Chain
from residency.keep.kv_tracking import Pending, Tracked
from residency.keep.rewarm_prompts import prefix_prompts, rewarm_body
from residency.keep.upstream import KeepSettings, KeptUpstream, ResidencyObserver
from residency.planning.plan_model import ResidencyPlan
from residency.planning.replicas import replica_plan
from residency.vllm_client import TransportError
from residency.vllm_client.kv_events import (
    EventBatch,
    KvEventSubscriber,
    first_source,
    sources_from,
    stop_task,
)

log = logging.getLogger("residency.serve")

REWARM_MAX_DEFER_S = 5.0  # the longest a re-warm waits for requests in flight to finish
# A re-warm waits until no block of a planned prefix was evicted on that upstream for this long:
# while a large request is still being prefilled (past the router too) it keeps evicting, and
# a re-warm sent into that would only be evicted again.
QUIET_S = 0.3
POLL_S = 0.05
# How long after a report-mode answer its stores may still arrive (published at the end of the
# engine step, read and applied a batch later).
REPORT_GRACE_S = 1.0


class EngineResidency:
    """KV-event residency for every upstream that publishes events, and its re-warms."""

    def __init__(
        self, settings: KeepSettings, metrics: AgentMetrics, plan: Callable[[], ResidencyPlan]
    ) -> None:
        self._settings = settings
        self._metrics = metrics
        self._plan = plan
        self._tracked: dict[int, Tracked] = {}
        self._pending: dict[tuple[int, str], Pending] = {}
        self._last_sent: dict[tuple[int, str], float] = {}
        self._last_hit: dict[int, float] = {}  # upstream -> when a planned block was last evicted
        self._refreshed: dict[int, float] = {}  # upstream -> when the whole prefixes were touched
        self._tasks: set[asyncio.Task[None]] = set()
        self.observer: ResidencyObserver | None = None  # eviction forensics (serve/forensics.py)

    def active(self, up: KeptUpstream) -> bool:
        """Residency on `up` comes from its events (its chains are being tracked)."""
        t = self._tracked.get(up.position)
        return t is not None and t.plan_key is not None

    def index(self, up: KeptUpstream) -> BlockIndex | None:
        """`up`'s block index, when it is in events mode."""
        t = self._tracked.get(up.position)
        return t.index if t is not None else None

    def rewarming(self, up: KeptUpstream, prefix_id: str) -> bool:
        """A re-warm of `prefix_id` on `up` is waiting or under way."""
        return (up.position, prefix_id) in self._pending

    async def attach(self, up: KeptUpstream) -> None:
        """Subscribe to `up`'s events when it publishes any (called as it joins, before the
        warm, so the warm's stores are seen); otherwise say that keep-warm counts tokens."""
        old = self._tracked.pop(up.position, None)
        if old is not None:
            await stop_task(old.task)
        if self._settings.kv_events == "off":
            self._metrics.kv_events.labels(up.label).set(0)
            return
        source = first_source(sources_from(await up.client.kv_event_sources(), up.url))
        if source is None:
            self._metrics.kv_events.labels(up.label).set(0)
            log.info(
                "upstream %s: no KV events (its /kv_event_sources lists no ZMQ publisher); "
                "keep-warm counts tokens",
                up.label,
            )
            return
        t = Tracked(up, source)
        bad = self._metrics.kv_event_errors
        subscriber = KvEventSubscriber(
            source,
            lambda batch: self._on_batch(t, batch),
            lambda: self._on_reset(t),
            on_bad=lambda kind: bad.labels(up.label, kind).inc(),
            max_bytes=self._settings.kv_event_max_bytes,
        )
        t.task = asyncio.get_running_loop().create_task(subscriber.run())
        t.task.add_done_callback(lambda task: self._ended(t, task))
        self._tracked[up.position] = t
        log.info(
            "upstream %s: residency from vLLM's KV events (%s, replay %s)",
            up.label,
            source.endpoint,
            source.replay_endpoint or "none",
        )

    async def refresh(self, up: KeptUpstream) -> None:
        """Track the current plan's prefixes on `up` (after it was warmed with them): their
        shared prompts from its /tokenize, then a learning probe for each not yet seen whole."""
        t = self._tracked.get(up.position)
        if t is None or up.model is None:
            return
        if (plan := replica_plan(self._plan(), up.position)) is None:  # a fleet: its own
            return
        key = tuple(p.sha256 for p in plan.all_prefixes())
        try:
            api_key = self._settings.upstream_api_key
            prompts = await anyio.to_thread.run_sync(prefix_prompts, plan, up, api_key)
        except (ResidencyError, TransportError) as exc:
            log.warning(
                "upstream %s: prefix prompts unreadable (%s); keep-warm counts tokens",
                up.label,
                exc,
            )
            t.plan_key = None
            self._metrics.kv_events.labels(up.label).set(0)
            return
        t.prompts = prompts
        t.index.set_prefixes(Chain(pid, ids) for pid, ids in prompts.items())
        t.plan_key = key
        self._metrics.kv_events.labels(up.label).set(1)
        await asyncio.sleep(0)  # let batches already received apply before judging
        for prefix_id in prompts:
            if not t.index.whole(prefix_id):
                self._schedule(t, prefix_id, "learn", at_once=True)
        self._publish(t)

    def refresh_soon(self, up: KeptUpstream) -> None:
        """`refresh` as a task (from synchronous callers)."""
        if up.position in self._tracked:
            self._spawn(self.refresh(up))

    async def ready(self, up: KeptUpstream, prefix_id: str) -> None:
        """Before a request goes to `up` with `prefix_id`: a re-warm of that prefix waiting
        there goes as soon as --rewarm-interval allows, and the request waits for it (it would
        prefill the prefix itself), at most --rewarm-wait seconds: then it goes and prefills
        what is missing."""
        bound = min(self._settings.request_timeout_s, self._settings.rewarm_wait_s)
        deadline = time.monotonic() + bound
        while (pending := self._pending.get((up.position, prefix_id))) is not None:
            pending.go.set()  # a follow-up re-warm (evicted again meanwhile) is waited for too
            left = deadline - time.monotonic()
            if left <= 0:
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(pending.done.wait(), left)

    async def stop(self) -> None:
        """Unsubscribe and cancel the re-warms (at shutdown)."""
        for t in self._tracked.values():
            await stop_task(t.task)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def settle(self) -> None:
        """Wait for the re-warms and refreshes in flight."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def _on_batch(self, t: Tracked, batch: EventBatch) -> None:
        self._metrics.event_batches.labels(t.up.label).inc()
        # Off the event loop: a batch may hold thousands of hashes (the index takes its lock
        # a chunk at a time, so the loop's reads wait for a chunk at most).
        change = await anyio.to_thread.run_sync(t.index.apply, batch.events)
        self._metrics.kv_event_hashes.labels(t.up.label).set(t.index.known_hashes)
        if t.plan_key is None:
            return
        reason = "cleared" if change.cleared else "evicted"
        if change.evicted:
            self._last_hit[t.up.position] = time.monotonic()
        for prefix_id in change.evicted:
            self._metrics.block_evictions.labels(t.up.label, prefix_id).inc()
            if self.observer is not None:
                resident = t.index.resident_blocks(prefix_id)
                total = t.index.total_blocks(prefix_id) or 0
                self.observer.evicted(t.up, prefix_id, resident, total, batch.ts)
            log.info(
                "upstream %s: prefix %s lost blocks (%d of %s resident, KV events); re-warm "
                "scheduled",
                t.up.label,
                prefix_id,
                t.index.resident_blocks(prefix_id),
                t.index.total_blocks(prefix_id),
            )
            self._schedule(t, prefix_id, reason)
        if change.cleared:
            for prefix_id in t.index.prefix_ids:
                self._schedule(t, prefix_id, reason)
        self._publish(t)

    def _ended(self, t: Tracked, task: asyncio.Task[None]) -> None:
        """A subscriber that failed: back to keep-warm's count on that upstream, said once."""
        if task.cancelled() or task.exception() is None:
            return
        log.error(
            "upstream %s: KV events from %s stopped (%s); keep-warm counts tokens",
            t.up.label,
            t.source.endpoint,
            task.exception(),
        )
        if self._tracked.get(t.up.position) is t:
            del self._tracked[t.up.position]
        self._metrics.kv_events.labels(t.up.label).set(0)

    def _on_reset(self, t: Tracked) -> None:
        """The publisher restarted: nothing is known of its cache; warm every prefix again."""
        t.index.reset()
        if t.plan_key is None:
            return
        for prefix_id in t.index.prefix_ids:
            self._schedule(t, prefix_id, "restart")
        self._publish(t)

    def _publish(self, t: Tracked) -> None:
        for prefix_id in t.index.prefix_ids:
            total = t.index.total_blocks(prefix_id) or 0
            self._metrics.chain_blocks.labels(t.up.label, prefix_id).set(total)
            resident = t.index.resident_blocks(prefix_id)
            self._metrics.resident_blocks.labels(t.up.label, prefix_id).set(resident)
            if self.observer is not None:
                self.observer.published(t.up.label, prefix_id, resident, total)

    def _schedule(self, t: Tracked, prefix_id: str, reason: str, at_once: bool = False) -> None:
        key = (t.up.position, prefix_id)
        if prefix_id not in t.prompts:
            return
        waiting = self._pending.get(key)
        if waiting is not None:
            waiting.again = waiting.again or waiting.sent
            return
        pending = self._pending[key] = Pending(reason)
        if at_once:
            pending.go.set()
        self._spawn(self._rewarm(t, prefix_id, pending))

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _rewarm(self, t: Tracked, prefix_id: str, pending: Pending) -> None:
        """Wait for the prefix's turn, then send its warm prompt in one request together with
        every other prefix waiting on that upstream and, after an eviction, the planned
        prefixes still whole there (see `_refresh`)."""
        key = (t.up.position, prefix_id)
        carried: list[tuple[str, Pending]] = [(prefix_id, pending)]
        refreshed: list[str] = []
        result = "failed"
        try:
            await self._wait_turn(t, key, pending)
            if pending.carried:  # another prefix's re-warm took this one along; it finishes it
                return
            if not t.up.usable or t.up.model is None:
                return
            # No await from here until the request is built: a prefix is carried by one
            # re-warm only.
            carried += self._claim(t, prefix_id)
            if any(p.reason != "learn" for _, p in carried):
                refreshed = self._refresh(t, {pid for pid, _ in carried})
            now = time.monotonic()
            for pid, p in carried:
                p.sent = True
                self._last_sent[(t.up.position, pid)] = now
            # The whole prefixes first: vLLM takes their cached blocks out of the free queue
            # as it schedules them, so the evicted blocks' new ones come from older leftovers.
            order = refreshed + [pid for pid, _ in carried]
            prompts = [t.prompts[x] for x in order]
            # vLLM's usage of a request with several prompts reports one prompt's cached
            # tokens: what it prefills is read from the block index instead.
            prefill = sum(t.index.uncached_tokens(x, len(t.prompts[x])) for x in order)
            async with t.slots:
                t.index.reporting += 1  # its found-cached blocks come back as stores
                try:
                    answer = await t.up.client.generate(
                        "completions", rewarm_body(t.up.model, prompts)
                    )
                finally:
                    loop = asyncio.get_running_loop()
                    loop.call_later(REPORT_GRACE_S, _unreport, t.index)
            self._metrics.keep_warm_requests.labels(t.up.label, "rewarm").inc()
            result = "ok" if answer.status_code == 200 else "failed"
            if answer.status_code != 200:
                names, status = ", ".join(pid for pid, _ in carried), answer.status_code
                log.info("upstream %s: re-warm of %s answered %d", t.up.label, names, status)
            else:
                self._metrics.keep_warm_prefill_tokens.labels(t.up.label, "rewarm").inc(prefill)
        except (TransportError, ResidencyError) as exc:
            log.info("upstream %s: re-warm of %s failed (%s)", t.up.label, prefix_id, exc)
        finally:
            if not pending.carried:
                for pid, p in carried:
                    self._finish(t, pid, p, result)
                for other in refreshed:
                    self._metrics.rewarms.labels(t.up.label, other, "refresh", result).inc()

    async def _wait_turn(self, t: Tracked, key: tuple[int, str], pending: Pending) -> None:
        """Every reason waits for --rewarm-interval since the prefix's last re-warm: a flood
        of restarts or clears must not chain re-warms. `go` (a learning probe, a request
        waiting for the prefix) skips only the quiet and in-flight waits."""
        earliest = self._last_sent.get(key, -1e9) + self._settings.rewarm_interval_s
        give_up_waiting = time.monotonic() + REWARM_MAX_DEFER_S
        while True:
            now = time.monotonic()
            if now < earliest:
                await asyncio.sleep(min(earliest - now, POLL_S))
                continue
            quiet = now - self._last_hit.get(t.up.position, -1e9) >= QUIET_S
            idle = t.up.outstanding == 0 or now >= give_up_waiting
            if pending.go.is_set() or (quiet and idle):
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(pending.go.wait(), POLL_S)

    def _claim(self, t: Tracked, prefix_id: str) -> list[tuple[str, Pending]]:
        """The other re-warms waiting on `t`'s upstream, not yet sent: carried along now."""
        taken = []
        now, interval = time.monotonic(), self._settings.rewarm_interval_s
        for (position, other), p in self._pending.items():
            if position != t.up.position or other == prefix_id or p.sent:
                continue
            if now >= self._last_sent.get((position, other), -1e9) + interval:
                p.carried = p.sent = True
                p.go.set()  # its own task stops waiting and leaves it to this one
                taken.append((other, p))
        return taken

    def _finish(self, t: Tracked, prefix_id: str, pending: Pending, result: str) -> None:
        key = (t.up.position, prefix_id)
        if self._pending.get(key) is pending:
            del self._pending[key]
        if pending.again and t.up.position in self._tracked:
            self._schedule(t, prefix_id, pending.reason, at_once=pending.go.is_set())
        pending.done.set()
        self._metrics.rewarms.labels(t.up.label, prefix_id, pending.reason, result).inc()
        if self.observer is not None:
            self.observer.rewarmed(t.up.label, prefix_id, pending.reason, result)

    def _refresh(self, t: Tracked, refilled: set[str]) -> list[str]:
        """The planned prefixes still whole on `t`'s upstream, to touch beside a refill, once
        per burst of evictions. An eviction means the LRU front has reached the plan's blocks,
        and the blocks a large request left behind are younger than them: the refill would
        evict the next prefix, and its refill the one after. Touched (a hit: about one block of
        prefill each), they are younger than those leftovers, which go first."""
        position = t.up.position
        if self._refreshed.get(position, -1e9) >= self._last_hit.get(position, -1e9):
            return []
        self._refreshed[position] = time.monotonic()
        return [
            other
            for other in t.index.prefix_ids
            if other not in refilled
            and t.index.whole(other)
            and (position, other) not in self._pending
        ]


def _unreport(index: BlockIndex) -> None:
    index.reporting -= 1
