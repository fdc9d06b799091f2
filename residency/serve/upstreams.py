"""The upstream vLLM servers: health-checked, warmed as they join, balanced by least
outstanding requests. Addresses stay inside this module's logs; clients see positions only."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass, field

from residency.serve.telemetry import RouterMetrics
from residency.vllm_client import AsyncVllmClient, Session
from residency.vllm_client.async_client import Probe

log = logging.getLogger("residency.serve")

JoinHook = Callable[["Upstream"], Awaitable[bool]]

# Consecutive probes without an answer before a serving upstream leaves rotation (Envoy's
# `unhealthy_threshold`). vLLM's API server answers /health from the event loop that also streams
# every token, so on a loaded host a busy server answers one probe late: slow is not down. A
# refused or reset connection, or a status other than 200, takes it out at once.
SLOW_PROBES_DOWN = 3
PROBE_TIMEOUT_S = 5.0  # one /health probe


@dataclass(slots=True)
class Upstream:
    """One vLLM server and what the router knows about it."""

    position: int
    client: AsyncVllmClient
    healthy: bool = False
    outstanding: int = 0
    model: str | None = None
    excluded: str | None = None  # why it is out of rotation for good (e.g. another model)
    served: int = field(default=0)
    slow_probes: int = 0  # consecutive health probes that timed out

    @property
    def url(self) -> str:
        """Its base URL (no trailing /v1): for the router's own logs only."""
        return self.client.base_url

    @property
    def label(self) -> str:
        """The metric / client-facing name: its position in --upstream."""
        return str(self.position)

    @property
    def usable(self) -> bool:
        """Healthy and not excluded."""
        return self.healthy and self.excluded is None


class NoUpstreamError(Exception):
    """No upstream is healthy."""


class UpstreamPool:
    """Keeps upstream health current and hands out the least busy one."""

    def __init__(
        self,
        urls: Sequence[str],
        http: Session,
        metrics: RouterMetrics,
        interval_s: float,
        on_join: JoinHook | None = None,
        api_key: str | None = None,
    ) -> None:
        self.upstreams = [
            Upstream(i, AsyncVllmClient(u, http, api_key=api_key)) for i, u in enumerate(urls)
        ]
        self._metrics = metrics
        self._interval_s = interval_s
        self._on_join = on_join
        self._task: asyncio.Task[None] | None = None
        self._joining: set[int] = set()
        for up in self.upstreams:
            metrics.upstream_healthy.labels(up.label).set(0)
            metrics.upstream_outstanding.labels(up.label).set(0)

    async def start(self) -> None:
        """Check every upstream once (warming the healthy ones), then keep checking."""
        await asyncio.gather(*(self.check(up) for up in self.upstreams))
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        """Stop the health loop."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            await asyncio.gather(*(self.check(up) for up in self.upstreams))

    async def check(self, up: Upstream) -> None:
        """Probe /health; a server that comes (back) up re-joins: model read, then warmed."""
        if up.position in self._joining:
            return
        probe = await up.client.probe(timeout_s=PROBE_TIMEOUT_S)
        up.slow_probes = up.slow_probes + 1 if probe is Probe.SLOW else 0
        if probe is Probe.SLOW and up.healthy and up.slow_probes < SLOW_PROBES_DOWN:
            log.info(
                "upstream %s (%s) answered no health probe in %g s (%d of %d)",
                *(up.label, up.url, PROBE_TIMEOUT_S, up.slow_probes, SLOW_PROBES_DOWN),
            )
            return
        ok = probe is Probe.UP
        if ok and not up.healthy:
            self._joining.add(up.position)
            try:
                ok = await self._join(up)
            finally:
                self._joining.discard(up.position)
        if ok != up.healthy:
            log.warning("upstream %s (%s) is %s", up.label, up.url, "up" if ok else "down")
        self._set_health(up, ok)

    async def _join(self, up: Upstream) -> bool:
        up.model = await up.client.first_model(timeout_s=10.0)
        if up.model is None:
            return False
        if self._on_join is not None:
            return await self._on_join(up)
        return True

    def _set_health(self, up: Upstream, ok: bool) -> None:
        up.healthy = ok
        self._metrics.upstream_healthy.labels(up.label).set(1 if up.usable else 0)

    def mark_down(self, up: Upstream) -> None:
        """Take an upstream out of rotation until its next good health check."""
        if up.healthy:
            log.warning("upstream %s (%s) failed a request; out of rotation", up.label, up.url)
        self._set_health(up, False)

    def pick(
        self, exclude: Sequence[Upstream] = (), holders: Collection[int] | None = None
    ) -> Upstream:
        """The usable upstream with the fewest requests in flight (ties: least served); with
        `holders` (positions of the replicas whose KV cache holds the question's prefix, from the
        plan's placement) one of them while any is usable, else any usable upstream."""
        candidates = [u for u in self.upstreams if u.usable and u not in exclude]
        if not candidates:
            raise NoUpstreamError
        if holders is not None:
            candidates = [u for u in candidates if u.position in holders] or candidates
        return min(candidates, key=lambda u: (u.outstanding, u.served, u.position))

    @property
    def usable_positions(self) -> frozenset[int]:
        """Positions of the upstreams that can take requests."""
        return frozenset(u.position for u in self.upstreams if u.usable)

    @property
    def any_usable(self) -> bool:
        """At least one upstream can take requests."""
        return any(u.usable for u in self.upstreams)

    async def acquire(self, up: Upstream) -> None:
        """Count a request against `up` (pair with `release`)."""
        up.outstanding += 1
        up.served += 1
        self._metrics.upstream_outstanding.labels(up.label).set(up.outstanding)

    def release(self, up: Upstream) -> None:
        """The request counted by `acquire` is over."""
        up.outstanding -= 1
        self._metrics.upstream_outstanding.labels(up.label).set(up.outstanding)

    @contextlib.asynccontextmanager
    async def lease(self, up: Upstream) -> AsyncIterator[Upstream]:
        """Count a request against `up` while the block runs."""
        await self.acquire(up)
        try:
            yield up
        finally:
            self.release(up)
