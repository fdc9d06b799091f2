"""One keep-residency mechanism with two sources: every planned prefix is warmed on an upstream
as it joins, then kept resident there from the engine's KV events where it publishes them
(kv_residency.py: re-warm what vLLM reports evicted) and from the token count elsewhere
(token_count.py: touch what is about to be evicted). The router speaks only to this object."""

from __future__ import annotations

import logging
from collections.abc import Callable

import anyio

from residency.errors import ResidencyError, UpstreamMismatchError
from residency.keep.block_index import BlockIndex
from residency.keep.kv_residency import EngineResidency
from residency.keep.token_count import KeepWarmPolicy, TokenCount
from residency.keep.upstream import KeepMetrics, KeepSettings, KeptUpstream, ResidencyObserver
from residency.planning.plan_model import ResidencyPlan
from residency.planning.replicas import replica_plan
from residency.vllm_client import Usage
from residency.warm import WarmOptions, WarmReport, warm

log = logging.getLogger("residency.serve")


class ResidencyKeeper:
    """Keeps the current plan's prefixes resident on every upstream, whichever source says
    how: KV events where an upstream publishes them, the token count elsewhere."""

    def __init__(
        self,
        settings: KeepSettings,
        metrics: KeepMetrics,
        plan: Callable[[], ResidencyPlan],
        policy: Callable[[], KeepWarmPolicy],
        observer: ResidencyObserver | None = None,
    ) -> None:
        self._settings = settings
        self._plan = plan  # the plan being served (reloads swap it)
        self.engine = EngineResidency(settings, metrics.agent, plan)
        self.engine.observer = observer
        self.count = TokenCount(metrics, policy)

    async def join(self, up: KeptUpstream) -> bool:
        """`up` joined (or came back): subscribe to its KV events before the warm, so that the
        warm's stores are seen, then warm the plan on it (with --warm). False when it serves
        another model: it stays out of rotation (`up.excluded` says why)."""
        await self.engine.attach(up)
        if not self._settings.warm_on_join:
            self.engine.refresh_soon(up)
            return True
        options = WarmOptions(
            server=up.url,
            request_timeout_s=self._settings.request_timeout_s,
            api_key=self._settings.upstream_api_key,
        )
        try:
            held = replica_plan(self._plan(), up.position)  # a fleet: its placed prefixes
            if held is None:  # this replica holds none of them
                return True
            report = await anyio.to_thread.run_sync(warm, held, options)
        except UpstreamMismatchError as exc:
            up.excluded = str(exc)
            log.error("upstream %s excluded: %s", up.label, exc)
            return False
        except ResidencyError as exc:
            log.warning("upstream %s: warm failed (%s); serving it cold", up.label, exc)
            return True
        self.warmed(up)
        _log_warmed(up, report)
        return True

    def warmed(self, up: KeptUpstream) -> None:
        """`up` was just warmed (it joined or came back, or a new plan was swapped in): every
        prefix is young on it, and KV-event residency tracks the plan's prefixes anew."""
        self.count.warmed(up)
        self.engine.refresh_soon(up)

    async def ready(self, up: KeptUpstream, prefix_id: str) -> None:
        """Before a request goes to `up`: wait for a re-warm of its prefix under way there."""
        await self.engine.ready(up, prefix_id)

    def observe(self, up: KeptUpstream, prefix_id: str | None, usage: Usage) -> None:
        """Account a finished client request; touches go out only where no events are read."""
        self.count.observe(up, prefix_id, usage, touch=not self.engine.active(up))

    def index(self, up: KeptUpstream) -> BlockIndex | None:
        """`up`'s block index, when it is in events mode."""
        return self.engine.index(up)

    async def settle(self) -> None:
        """Wait for the touches, re-warms and refreshes in flight."""
        await self.count.settle()
        await self.engine.settle()

    async def stop(self) -> None:
        """Unsubscribe and cancel the touches and re-warms in flight (at shutdown)."""
        await self.engine.stop()
        await self.count.stop()


def _log_warmed(up: KeptUpstream, report: WarmReport) -> None:
    """One line: how much of the plan `up` holds after its warm."""
    every = report.prefixes
    log.info(
        "upstream %s warmed: %d of %d shared tokens cached (%d of %d prefixes resident)",
        up.label,
        sum(p.cached_tokens for p in every) if every else report.cached_tokens,
        sum(p.shared_prefix_tokens for p in every) if every else report.shared_prefix_tokens,
        sum(p.resident for p in every) if every else int(report.resident),
        len(every) or 1,
    )
