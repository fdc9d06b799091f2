"""A fleet's placement as the router and `warm` see it: which upstreams hold a prefix (so the
router sends a question where its prefix is cached) and the plan one replica is warmed with."""

from __future__ import annotations

from residency.errors import ConfigError
from residency.planning.plan_model import ResidencyPlan


def prefix_holders(plan: ResidencyPlan, prefix_id: str) -> frozenset[int] | None:
    """Positions (in --upstream order) of the replicas that hold `prefix_id`; None: the plan
    has no placement, every replica holds every prefix."""
    if plan.placement is None:
        return None
    return frozenset(plan.placement.holders(prefix_id))


def replica_plan(plan: ResidencyPlan, position: int) -> ResidencyPlan | None:
    """`plan` as the replica at `position` holds it: its prefixes only (busiest first, as in the
    plan); the whole plan without a placement; None for a replica that holds no prefix."""
    if plan.placement is None:
        return plan
    ids = plan.placement.prefix_ids_of(position)
    if ids is None:
        raise ConfigError(
            f"upstream {position}: the plan places prefixes on {len(plan.placement.replicas)} "
            "replicas; give as many --upstream (or re-plan with --replicas)"
        )
    held = tuple(p for p in plan.all_prefixes() if p.id in ids)
    if not held:
        return None
    resident = tuple({r.id: r for p in held for r in p.resident}.values())
    share = min(sum(p.traffic_share for p in held), 1.0)
    coverage = plan.coverage.model_copy(update={"resident_share": share})
    update = {"prefixes": held, "prefix": held[0].prefix, "resident": resident}
    return plan.model_copy(update={**update, "coverage": coverage})
