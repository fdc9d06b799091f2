"""A replica of a fleet gone: its prefixes re-placed on the survivors within their rooms (the
survivors keep what they hold; what only the dead held goes where it still fits, hottest
first), and the plan's own placement back once every replica is healthy again."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection

import anyio

from planner.units import round_up
from residency.errors import ResidencyError
from residency.planning.fleet import routed_shares
from residency.planning.placement import PrefixDemand, ReplicaRoom, place_prefixes
from residency.planning.placement_model import Placement, ReplicaPlacement
from residency.planning.plan_model import ResidencyPlan
from residency.planning.replicas import replica_plan
from residency.serve.upstreams import UpstreamPool
from residency.warm import WarmOptions, warm

log = logging.getLogger("residency.serve")


def survivor_placement(plan: ResidencyPlan, alive: Collection[int]) -> Placement | None:
    """The placement while only the replicas at `alive` serve: each survivor keeps its own
    prefixes and takes the dead replicas' prefixes that no survivor holds, hottest first, where
    its room allows. None: the plan has no placement, or every replica is alive."""
    placement = plan.placement
    if placement is None:
        return None
    positions = {r.position for r in placement.replicas}
    if positions <= set(alive):
        return None
    survivors = [r for r in placement.replicas if r.position in alive]
    if not survivors:
        return None
    kept = {p for r in survivors for p in r.prefix_ids}
    orphans = [p for p in plan.all_prefixes() if p.id not in kept]
    shares = routed_shares(plan.all_prefixes())
    block = plan.capacity.block_size
    shared = plan.arithmetic.shared_kv_tokens if plan.arithmetic else 0
    # Each survivor's room less what it already holds; the first orphan it takes reuses the
    # shared head it already caches, so every orphan costs its blocks less the head.
    rooms = [
        ReplicaRoom(r.position, max(r.room_tokens - r.resident_kv_tokens, 0)) for r in survivors
    ]
    demands = [
        PrefixDemand(p.id, max(round_up(p.tokens, block) - shared, block), shares[p.id])
        for p in orphans
    ]
    taken = place_prefixes(demands, rooms).held
    return placement.model_copy(
        update={
            "replicas": tuple(
                ReplicaPlacement(**{**r.model_dump(), "prefix_ids": (*r.prefix_ids, *extra)})
                for r, extra in zip(survivors, taken, strict=True)
            ),
            "method": f"survivors of {len(positions)} replicas: {placement.method}",
        }
    )


def effective_plan(plan: ResidencyPlan, alive: Collection[int]) -> ResidencyPlan:
    """`plan` with the placement the replicas at `alive` serve (its own when all are)."""
    survivors = survivor_placement(plan, alive)
    return plan if survivors is None else plan.model_copy(update={"placement": survivors})


class FailoverWarmer:
    """Watches a pool of replicas: when one goes, each survivor is warmed with the prefixes it
    takes over (`survivor_placement`); the one that returns is warmed with its own as it joins
    (the pool's join hook), and the survivors' extra copies age out of their LRU caches."""

    def __init__(
        self,
        pool: UpstreamPool,
        plan: Callable[[], ResidencyPlan],
        *,
        interval_s: float,
        request_timeout_s: float,
        api_key: str | None = None,
    ) -> None:
        self._pool = pool
        self._plan = plan
        self._interval_s = interval_s
        self._timeout_s = request_timeout_s
        self._api_key = api_key
        self.rewarms = 0  # survivors warmed with a dead replica's prefixes

    async def run(self) -> None:
        """Check the pool every interval; re-place and warm when the live set shrinks."""
        last: frozenset[int] | None = None
        while True:
            alive = frozenset(u.position for u in self._pool.upstreams if u.usable)
            if alive != last and alive:
                await self._rewarm(alive)
            last = alive
            await asyncio.sleep(self._interval_s)

    async def _rewarm(self, alive: frozenset[int]) -> None:
        plan = self._plan()
        survivors = survivor_placement(plan, alive)
        if survivors is None or plan.placement is None:
            return
        for r in survivors.replicas:
            extra = set(r.prefix_ids) - set(plan.placement.prefix_ids_of(r.position) or ())
            up = next(u for u in self._pool.upstreams if u.position == r.position)
            if not extra or not up.usable:
                continue
            held = replica_plan(plan.model_copy(update={"placement": survivors}), r.position)
            if held is None:
                continue
            options = WarmOptions(
                server=up.url, request_timeout_s=self._timeout_s, api_key=self._api_key
            )
            try:
                await anyio.to_thread.run_sync(warm, held, options)
            except ResidencyError as exc:
                log.warning("replica %s: failover warm failed (%s)", up.label, exc)
                continue
            self.rewarms += 1
            log.warning(
                "replica %s took over prefixes %s of the replicas down (live: %s)",
                up.label,
                ", ".join(sorted(extra)),
                ", ".join(str(p) for p in sorted(alive)),
            )
