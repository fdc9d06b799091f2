"""Mode 2 of a fleet: `--upstream` is a router in front of the replicas (vllm-router, whose
`kv_aware` policy picks a replica by its KV events), and residency keeps the placement itself:
each `--replica` is health-checked and warmed directly with its own prefixes as it joins and
whenever it comes back. Requests never go to a replica from here."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import anyio

from residency.errors import ResidencyError
from residency.planning.plan_model import ResidencyPlan
from residency.planning.replicas import replica_plan
from residency.serve.telemetry import RouterMetrics
from residency.serve.upstreams import Upstream, UpstreamPool
from residency.vllm_client import Session
from residency.warm import WarmOptions, warm

log = logging.getLogger("residency.serve")


class ReplicaKeeper:
    """The replicas behind a router: each warmed with its placed prefixes on every (re)join."""

    def __init__(
        self,
        urls: Sequence[str],
        http: Session,
        plan: Callable[[], ResidencyPlan],
        *,
        interval_s: float,
        request_timeout_s: float,
        api_key: str | None = None,
    ) -> None:
        self._plan = plan
        self._timeout_s = request_timeout_s
        self._api_key = api_key
        self.warms = 0  # completed warms, all replicas (for the status and tests)
        # Its own metrics registry: the replicas' health is not the upstreams'.
        self.pool = UpstreamPool(urls, http, RouterMetrics(), interval_s, self._join, api_key)

    async def start(self) -> None:
        """Warm every healthy replica, then keep checking them."""
        await self.pool.start()

    async def stop(self) -> None:
        """Stop the health loop."""
        await self.pool.stop()

    async def _join(self, up: Upstream) -> bool:
        held = replica_plan(self._plan(), up.position)
        if held is None:
            return True
        options = WarmOptions(
            server=up.url, request_timeout_s=self._timeout_s, api_key=self._api_key
        )
        try:
            report = await anyio.to_thread.run_sync(warm, held, options)
        except ResidencyError as exc:
            log.warning("replica %s: warm failed (%s); it serves cold", up.label, exc)
            return True
        self.warms += 1
        log.info(
            "replica %s warmed directly: %d of %d prefixes resident",
            up.label,
            sum(p.resident for p in report.prefixes),
            len(report.prefixes),
        )
        return True
