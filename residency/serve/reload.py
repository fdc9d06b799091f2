"""Reload plan.json while serving (SIGHUP, or `--watch-plan` polling the file).

A new plan is validated as at startup (the plan model, its index and corpus, every prefix within
each upstream's window), then its prefixes are warmed and proven cached on every upstream in
rotation; only then does the router's serving state change, in one assignment on the event loop.
Requests already running keep the state they started with. A plan that fails any step, with
any exception (a torn index file raises numpy's ValueError, not one of ours), is refused in one
log line and counted, and the old plan keeps serving.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from pathlib import Path

import anyio

from residency.errors import ConfigError, ResidencyError
from residency.keep.keeper import ResidencyKeeper
from residency.planning.plan_model import ResidencyPlan
from residency.serve.series import initialise_series
from residency.serve.settings import ServeSettings
from residency.serve.state import (
    Current,
    ServingState,
    load_state,
    plan_sha256,
    read_plan_bytes,
)
from residency.serve.telemetry import RouterMetrics
from residency.serve.upstreams import Upstream, UpstreamPool
from residency.vllm_client import VllmClient
from residency.warm import WarmOptions, served_matches, warm

log = logging.getLogger("residency.serve")


class PlanReloader:
    """Loads, checks, warms and swaps in the plan at `settings.plan`, one reload at a time."""

    def __init__(
        self,
        settings: ServeSettings,
        current: Current,
        pool: UpstreamPool,
        keeper: ResidencyKeeper,
        metrics: RouterMetrics,
    ) -> None:
        self.settings = settings
        self.current = current
        self.pool = pool
        self.keeper = keeper
        self.metrics = metrics
        self._lock = asyncio.Lock()
        self._tried_sha256 = current.state.plan_sha256  # the last content a reload looked at
        self._trying: str | None = None  # the sha256 of the plan being tried, once read
        self._stat: tuple[int, int] | None = _stat(settings.plan)

    async def reload(self, trigger: str, data: bytes | None = None) -> str:
        """Try the plan file now (or `data`, a plan made in process: the re-planner's): 'ok'
        (swapped), 'refused' (old plan kept) or 'unchanged'."""
        async with self._lock:
            old = self.current.state
            try:
                return await self._reload(trigger, data)
            except Exception as exc:  # every failure is a refusal, said once
                if not isinstance(exc, ResidencyError):  # the stack, for whoever looks deeper
                    log.debug("plan reload (%s) failed", trigger, exc_info=exc)
                why = str(exc) if isinstance(exc, ResidencyError) else _describe(exc)
                return self._refuse(trigger, old, why, self._trying)

    async def _reload(self, trigger: str, data: bytes | None = None) -> str:
        started = time.perf_counter()
        old = self.current.state
        self._trying = None
        if data is None:
            data = await anyio.to_thread.run_sync(read_plan_bytes, self.settings.plan)
        new_sha = self._trying = plan_sha256(data)
        self._tried_sha256 = new_sha
        if new_sha == old.plan_sha256:
            log.info("plan reload (%s): plan %s unchanged; nothing to do", trigger, old.short_sha)
            return "unchanged"
        state = await anyio.to_thread.run_sync(load_state, self.settings, data, old)
        await anyio.to_thread.run_sync(state.builder.warm_up)
        warmed = await self._prepare(state.builder.plan)
        self.current.state = state  # one reference: the next request starts on the new plan
        for up in self.pool.upstreams:  # every prefix of the new plan was just warmed
            if up.usable:
                self.keeper.warmed(up)
        self.metrics.plan_reloads.labels("ok").inc()
        self.metrics.set_plan(state.plan_sha256)
        labels = [up.label for up in self.pool.upstreams]
        initialise_series(self.metrics, labels, [p.id for p in state.builder.plan.all_prefixes()])
        prefixes = len(state.builder.plan.all_prefixes())
        log.info(
            "plan reloaded (%s): %s -> %s, %d prefix(es) warmed on %d upstream(s) (%s), %.1f s",
            trigger,
            old.short_sha,
            state.short_sha,
            prefixes,
            len(warmed),
            ", ".join(warmed) or "none in rotation",
            time.perf_counter() - started,
        )
        return "ok"

    def _refuse(self, trigger: str, old: ServingState, why: str, sha: str | None = None) -> str:
        self.metrics.plan_reloads.labels("refused").inc()
        tried = f" {sha[:12]}" if sha else ""
        log.error(
            "plan reload refused (%s): plan%s: %s; still serving plan %s",
            trigger,
            tried,
            why,
            old.short_sha,
        )
        return "refused"

    async def _prepare(self, plan: ResidencyPlan) -> list[str]:
        """Check and warm every upstream in rotation at once; 'label: cached/shared tokens'
        per upstream. Raises the first upstream's failure (naming it)."""
        ups = [u for u in self.pool.upstreams if u.usable]
        results = await asyncio.gather(
            *(anyio.to_thread.run_sync(self._prepare_one, plan, up) for up in ups),
            return_exceptions=True,
        )
        done: list[str] = []
        for up, result in zip(ups, results, strict=True):
            if isinstance(result, ResidencyError):
                raise ConfigError(f"upstream {up.label}: {result}") from None
            if isinstance(result, BaseException):
                raise result
            done.append(f"{up.label}: {result}")
        return done

    def _prepare_one(self, plan: ResidencyPlan, up: Upstream) -> str:
        """The window check, then warm (the same checks and proof as when an upstream joins)."""
        s = self.settings
        with VllmClient(up.url, timeout_s=30.0, api_key=s.upstream_api_key) as client:
            check_window(plan, client)
        if not s.warm:
            return "not warmed (--no-warm)"
        options = WarmOptions(
            server=up.url, request_timeout_s=s.request_timeout_s, api_key=s.upstream_api_key
        )
        report = warm(plan, options)
        cached = sum(p.cached_tokens for p in report.prefixes)
        proven = sum(p.resident for p in report.prefixes)
        return f"{proven}/{len(report.prefixes)} proven cached, {cached:,} tokens"

    def written(self) -> None:
        """The plan file was just rewritten with the plan being served (by the re-planner):
        `--watch-plan` has nothing to reload."""
        self._stat = _stat(self.settings.plan)

    async def watch(self, interval_s: float) -> None:
        """Poll the plan file; reload when its content changes (mtime and size first, then
        sha256, so an unchanged file is never re-read and a refused one is tried once)."""
        while True:
            await asyncio.sleep(interval_s)
            stat = _stat(self.settings.plan)
            if stat is None or stat == self._stat:
                continue
            self._stat = stat
            try:
                data = await anyio.to_thread.run_sync(read_plan_bytes, self.settings.plan)
            except ConfigError:
                continue  # replaced between stat and read: the next poll sees the new file
            if plan_sha256(data) != self._tried_sha256:
                await self.reload("--watch-plan")


def check_window(plan: ResidencyPlan, client: VllmClient) -> None:
    """Every prefix plus one request's own tokens within the server's max_model_len."""
    served_all = client.models()
    served = next((s for s in served_all if served_matches(plan.capacity.model, s)), None)
    window = (served or served_all[0]).max_model_len if served_all else None
    if window is None:
        return  # nothing to compare with: warm's checks still run
    reserve = plan.capacity.per_request_tokens or 0
    for p in plan.all_prefixes():
        if p.tokens + reserve > window:
            raise ConfigError(
                f"prefix {p.id} takes {p.tokens:,} tokens + {reserve:,} per request = "
                f"{p.tokens + reserve:,}, beyond --upstream {client.base_url} max_model_len "
                f"{window:,}; re-plan with --server {client.base_url} (or restart vLLM with "
                f"--max-model-len {p.tokens + reserve:,} or more)"
            )


def _describe(exc: BaseException) -> str:
    """One line for an exception that is not ours: its type and message, e.g.
    "ValueError: cannot reshape array of size 96 into shape (1024,)"."""
    text = " ".join(str(exc).split())[:500]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _stat(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size
