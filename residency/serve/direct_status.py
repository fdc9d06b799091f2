"""`residency status --plan P SERVER`: the residency picture of a vLLM server with no router in
front, from its own KV events. Read-only: it subscribes (replaying the publisher's buffer first,
so blocks cached before it listened are seen while the buffer still holds their `BlockStored`),
renders each planned prefix's shared prompt through the server's /tokenize and matches it
against the stored blocks, exactly as the router does (residency/keep/kv_residency.py), but
sends no request that would touch the cache. Hits and misses need the router's requests: zero
here; evictions seen since the buffer's start are recorded with vLLM's pool usage.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
from prometheus_client import CollectorRegistry

from residency.errors import UpstreamError
from residency.keep.agent_metrics import AgentMetrics
from residency.keep.block_index import BlockIndex, Chain
from residency.planning.plan_model import ResidencyPlan, read_plan
from residency.serve.forensics import RECENT_REQUESTS, Forensics
from residency.serve.state import plan_sha256, read_plan_bytes
from residency.serve.status_view import residency_status
from residency.serve.upstreams import Upstream
from residency.status.client import Reader
from residency.status.model import ResidencyStatus
from residency.vllm_client import AsyncVllmClient, VllmClient, open_session
from residency.vllm_client.async_client import Probe
from residency.vllm_client.kv_events import (
    EventBatch,
    KvEventSubscriber,
    first_source,
    sources_from,
    stop_task,
)
from residency.warm.verify import shared_prefix_ids

REPLAY_WAIT_S = 10.0  # the longest the first picture waits for the buffer's replay
REPLAY_QUIET_S = 0.5  # no batch for this long: the replay is over


class DirectEngine:
    """One server's planned blocks from its events (the `EngineView` of status_view.py)."""

    def __init__(self, up: Upstream, forensics: Forensics) -> None:
        self.up = up
        self.blocks = BlockIndex()
        self._forensics = forensics

    def active(self, up: Upstream) -> bool:
        return up is self.up

    def index(self, up: Upstream) -> BlockIndex | None:
        return self.blocks if up is self.up else None

    def rewarming(self, up: Upstream, prefix_id: str) -> bool:
        return False  # nothing re-warms here; a prefix short of blocks is partial or evicted

    def on_batch(self, batch: EventBatch) -> None:
        change = self.blocks.apply(batch.events)
        for prefix in change.evicted:
            total = self.blocks.total_blocks(prefix) or 0
            resident = self.blocks.resident_blocks(prefix)
            self._forensics.evicted(self.up, prefix, resident, total, batch.ts)
        for prefix in self.blocks.prefix_ids:
            total = self.blocks.total_blocks(prefix) or 0
            self._forensics.published(
                self.up.label, prefix, self.blocks.resident_blocks(prefix), total
            )

    def on_reset(self) -> None:
        self.blocks.reset()


@contextlib.asynccontextmanager
async def watch_server(
    plan_path: Path, server: str, api_key: str | None, timeout_s: float = 30.0
) -> AsyncIterator[DirectStatus]:
    """Subscribe to `server`'s KV events for the plan's prefixes; yields the live picture."""
    plan = read_plan(plan_path)
    sha = plan_sha256(read_plan_bytes(plan_path))
    async with open_session(timeout_s) as http:
        up = Upstream(0, AsyncVllmClient(server, http, api_key=api_key, flag="--server"))
        if await up.client.probe(timeout_s=timeout_s) is not Probe.UP:
            raise UpstreamError(f"status: cannot reach {server} (its /health does not answer 200)")
        up.model = await up.client.first_model(timeout_s=timeout_s)
        if up.model is None:
            raise UpstreamError(f"status: {server} lists no model at /v1/models (is it vLLM?)")
        up.healthy = True
        source = first_source(sources_from(await up.client.kv_event_sources(), server))
        if source is None:
            raise UpstreamError(
                f"{server}: its /kv_event_sources lists no ZMQ publisher; start vLLM with "
                '--kv-events-config \'{"enable_kv_cache_events": true, "publisher": "zmq", '
                "...}', or point `residency status` at the router instead"
            )
        prompts = await anyio.to_thread.run_sync(_prompts, plan, server, up.model, api_key)
        forensics = Forensics(AgentMetrics(CollectorRegistry()))
        engine = DirectEngine(up, forensics)
        engine.blocks.set_prefixes(Chain(pid, ids) for pid, ids in prompts.items())
        subscriber = KvEventSubscriber(source, engine.on_batch, engine.on_reset)
        task = asyncio.get_running_loop().create_task(subscriber.run())
        try:
            await _replayed(subscriber, task, source.replay_endpoint is not None)
            yield DirectStatus(sha, list(prompts), up, engine, forensics)
        finally:
            await stop_task(task)
            await forensics.stop()


@contextlib.asynccontextmanager
async def direct_source(
    plan: Path, url: str, api_key: str | None, last: int
) -> AsyncIterator[Reader]:
    """`residency status --plan`'s source (a `Reader` as the router's is): the vLLM server at
    `url`, its events read for the prefixes of `plan`."""
    try:
        async with watch_server(plan, url, api_key) as watched:

            async def read() -> ResidencyStatus:
                return watched.picture(last)

            yield read
    except OSError as exc:
        raise UpstreamError(f"status: cannot read {url} ({exc})") from None


async def _replayed(subscriber: KvEventSubscriber, task: asyncio.Task[None], replay: bool) -> None:
    """Wait until the publisher's buffer is replayed: no new batch for REPLAY_QUIET_S (at most
    REPLAY_WAIT_S); a subscriber that failed raises its error."""
    loop = asyncio.get_running_loop()
    deadline, seen, quiet_since = loop.time() + REPLAY_WAIT_S, -1, loop.time()
    while replay and loop.time() < deadline:
        if task.done():
            task.result()
        if subscriber.batches != seen:
            seen, quiet_since = subscriber.batches, loop.time()
        elif seen > 0 and loop.time() - quiet_since >= REPLAY_QUIET_S:
            return
        await asyncio.sleep(0.05)


class DirectStatus:
    """The picture of one server, redrawn from its events as they come."""

    def __init__(
        self,
        sha: str,
        prefix_ids: list[str],
        up: Upstream,
        engine: DirectEngine,
        forensics: Forensics,
    ) -> None:
        self._sha, self._ids, self._up = sha, prefix_ids, up
        self._engine, self._forensics = engine, forensics

    def picture(self, last: int = RECENT_REQUESTS) -> ResidencyStatus:
        """Now."""
        return residency_status(
            self._sha, self._ids, [self._up], self._engine, self._forensics, last
        )


def _prompts(
    plan: ResidencyPlan, server: str, model: str, api_key: str | None
) -> dict[str, tuple[int, ...]]:
    with VllmClient(server, timeout_s=60.0, api_key=api_key) as client:
        return {
            p.id: tuple(shared_prefix_ids(client, model, p.prefix.text))
            for p in plan.all_prefixes()
        }
