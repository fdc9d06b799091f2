"""The router and what runs beside it, built once with every part passed in and started and
stopped as one: the upstream pool, the residency keeper, the plan reloader, the re-planner, the
recall canary, the query log's periodic sync and the SIGHUP / SIGUSR1 handlers."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator, Coroutine
from typing import Any

import anyio

from residency.keep.keeper import ResidencyKeeper
from residency.keep.upstream import KeepSettings
from residency.serve.canary import RecallCanary
from residency.serve.drain import Drain
from residency.serve.failover import FailoverWarmer
from residency.serve.forensics import Forensics
from residency.serve.guard import Slots
from residency.serve.record import RouterQueryLog
from residency.serve.reload import PlanReloader
from residency.serve.replan import Replanner
from residency.serve.replica_keeper import ReplicaKeeper
from residency.serve.router import Router, RouterParts
from residency.serve.settings import WATCH_PLAN_INTERVAL_S, ServeSettings
from residency.serve.state import Current
from residency.serve.telemetry import RouterMetrics
from residency.serve.upstreams import Upstream, UpstreamPool
from residency.vllm_client import Session, open_session

LOG_SYNC_INTERVAL_S = 1.0  # the query log is fsynced this often, off the request path


def keep_settings(settings: ServeSettings) -> KeepSettings:
    """The serve flags the residency keeper reads."""
    agent = settings.agent
    return KeepSettings(
        warm_on_join=settings.warm,
        kv_events=agent.kv_events,
        kv_event_max_bytes=agent.kv_event_max_bytes,
        rewarm_interval_s=agent.rewarm_interval_s,
        rewarm_wait_s=agent.rewarm_wait_s,
        request_timeout_s=settings.request_timeout_s,
        upstream_api_key=settings.upstream_api_key,
    )


class RouterService:
    """The router with its pool, keeper, reloader, re-planner and canary; `running()` is the
    app's lifespan."""

    def __init__(
        self,
        settings: ServeSettings,
        router: Router,
        reloader: PlanReloader,
        replanner: Replanner | None,
        canary: RecallCanary | None,
        replicas: ReplicaKeeper | None = None,
    ) -> None:
        self.settings = settings
        self.router = router
        self.reloader = reloader
        self.replanner = replanner
        self.canary = canary
        self.replicas = replicas  # vllm-router in front: its replicas warmed and kept directly
        self._tasks: set[asyncio.Task[Any]] = set()

    @classmethod
    def build(
        cls,
        settings: ServeSettings,
        current: Current,
        http: Session,
        metrics: RouterMetrics,
        slots: Slots,
        drain: Drain,
    ) -> RouterService:
        """Every part, each given what it uses (all of them read the serving state through
        `current`, which a reload replaces)."""
        forensics = Forensics(metrics.agent)
        keeper = ResidencyKeeper(
            keep_settings(settings),
            metrics,
            plan=lambda: current.state.builder.plan,
            policy=lambda: current.state.keep_warm,
            observer=forensics,
        )
        # With --replica the --upstream is a router (vllm-router) in front of them: the
        # replicas are warmed and kept by ReplicaKeeper, the router's URL is only forwarded to.
        join = _router_in_front if settings.replicas else keeper.join
        pool = UpstreamPool(
            settings.upstreams,
            http,
            metrics,
            settings.health_interval_s,
            join,
            api_key=settings.upstream_api_key,
        )
        log = RouterQueryLog(settings.log, metrics) if settings.log else None
        parts = RouterParts(current, pool, http, metrics, slots, keeper, forensics, drain, log)
        reloader = PlanReloader(settings, current, pool, keeper, metrics)
        agent, replanner, canary = settings.agent, None, None
        if agent.replan_every_s is not None and settings.log is not None:
            replanner = Replanner(settings, reloader, metrics.agent, settings.log)
        if agent.canary is not None:
            canary = RecallCanary(agent, metrics.agent, lambda: current.state)
        replicas = None
        if settings.replicas:
            replicas = ReplicaKeeper(
                settings.replicas,
                http,
                lambda: current.state.builder.plan,
                interval_s=settings.health_interval_s,
                request_timeout_s=settings.request_timeout_s,
                api_key=settings.upstream_api_key,
            )
        router = Router(settings, parts)
        return cls(settings, router, reloader, replanner, canary, replicas)

    @classmethod
    @contextlib.asynccontextmanager
    async def serving(
        cls,
        settings: ServeSettings,
        current: Current,
        metrics: RouterMetrics,
        slots: Slots,
        drain: Drain,
    ) -> AsyncIterator[RouterService]:
        """Open the HTTP session, build the service on it and run it until the block ends."""
        async with open_session(settings.request_timeout_s) as http:
            await anyio.to_thread.run_sync(current.state.builder.warm_up)
            service = cls.build(settings, current, http, metrics, slots, drain)
            async with service.running():
                yield service

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Start the pool (each upstream warmed as it joins) and the background tasks; at the
        end stop them, the keeper, the pool and the query log, in that order."""
        router = self.router
        await router.pool.start()
        if self.replicas is not None:
            await self.replicas.start()
        if router.state.builder.plan.placement is not None:  # a replica down: survivors take over
            failover = FailoverWarmer(
                self.replicas.pool if self.replicas is not None else router.pool,
                lambda: router.state.builder.plan,
                interval_s=self.settings.health_interval_s,
                request_timeout_s=self.settings.request_timeout_s,
                api_key=self.settings.upstream_api_key,
            )
            self._spawn(failover.run())
        self._spawn(_sync_log_every(router, LOG_SYNC_INTERVAL_S))
        if self.settings.watch_plan:
            self._spawn(self.reloader.watch(WATCH_PLAN_INTERVAL_S))
        if self.replanner is not None:
            self._spawn(self.replanner.run())
        if self.canary is not None:
            self._spawn(self.canary.run())
        loop = asyncio.get_running_loop()
        # uvicorn handles SIGINT and SIGTERM only; SIGHUP and SIGUSR1 would otherwise end the
        # process.
        loop.add_signal_handler(signal.SIGHUP, self._on_sighup)
        loop.add_signal_handler(signal.SIGUSR1, router.reopen_log, "SIGUSR1")
        try:
            yield
        finally:
            loop.remove_signal_handler(signal.SIGHUP)
            loop.remove_signal_handler(signal.SIGUSR1)
            for task in self._tasks:
                task.cancel()
            await router.keeper.stop()
            await router.forensics.stop()
            await router.pool.stop()
            if self.replicas is not None:
                await self.replicas.stop()
            router.close()

    def _on_sighup(self) -> None:
        """logrotate's signal and the plan's, both."""
        self.router.reopen_log("SIGHUP")
        self._spawn(self.reloader.reload("SIGHUP"))

    def _spawn(self, coro: Coroutine[Any, Any, object]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


async def _router_in_front(up: Upstream) -> bool:
    """The join hook of an --upstream that is a router: nothing to warm there."""
    return True


async def _sync_log_every(router: Router, interval_s: float) -> None:
    """Flush the query log to disk once per interval, off the request path."""
    while True:
        await asyncio.sleep(interval_s)
        await anyio.to_thread.run_sync(router.sync_log)
