"""`residency plan` over a fleet of replicas: the prefixes the whole fleet can hold, planned as
one KV cache the size of every replica's room together (no prefix larger than the smallest
replica's room), then placed on the replicas (placement.py). Prefixes that cannot be placed
(whole prefixes do not split across replicas) make the planner try one prefix fewer."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from planner import InfeasiblePlanError
from planner.units import round_up
from residency.errors import ConfigError
from residency.planning.multi import default_shared_tokens
from residency.planning.placement import (
    Assignment,
    PrefixDemand,
    ReplicaRoom,
    place_prefixes,
)
from residency.planning.placement_model import Placement, ReplicaPlacement
from residency.planning.plan_model import CapacitySnapshot, PlanPrefix, ResidencyPlan
from residency.planning.shared_head import shared_kv_tokens

# Plans the prefixes for a capacity (forced count, or None: the planner's best count).
PlanOnce = Callable[[CapacitySnapshot, int | None], ResidencyPlan]
# A window cut to tile the replicas' rooms keeps at least this share of the window (below it the
# sections that filled a whole window no longer fit any prefix).
TILE_SHRINK_LIMIT = 0.75
PLACEMENT_METHOD = "shard hottest-first on the least loaded replica, then replicate by traffic"


def room_tokens(capacity: CapacitySnapshot) -> int:
    """KV tokens one replica's prefixes may take: its KV cache less its requests' reserve."""
    return max(capacity.kv_cache_tokens - (capacity.concurrency_reserve_tokens or 0), 0)


def fleet_capacity(
    replicas: Sequence[CapacitySnapshot], shared_tokens: int | None = None
) -> CapacitySnapshot:
    """The capacity the planner sees for the whole fleet: the first replica's model and
    settings, every replica's room together less the shared head each further replica holds
    again, one prefix at most the smallest room. Without a head the window is cut so that whole
    prefixes tile a replica's room (12,992 tokens, window 4,800: three of 4,320, not two of
    4,800 and 3,392 that no replica has room for), unless that cuts it by more than a quarter."""
    if not replicas:
        raise ConfigError("--replicas: a fleet needs at least one replica")
    base = replicas[0]
    if any(c.is_hybrid for c in replicas):
        raise ConfigError(
            "--replicas: hybrid models (one shared block pool per replica) are planned one "
            "host at a time; plan each replica on its own (leave --replicas out)"
        )
    block = base.block_size
    smallest = min(room_tokens(c) for c in replicas) // block * block
    window = min(base.context_limit_tokens or base.resident_budget_tokens, smallest)
    if window < block:
        raise ConfigError(
            f"--replicas: the smallest replica's KV room is {smallest} tokens, under one block "
            f"({block}); lower --concurrency or raise --gpu-memory-utilization"
        )
    windowed = base.model_copy(update={"context_limit_tokens": window})
    head = default_shared_tokens(windowed) if shared_tokens is None else shared_tokens
    shared = shared_kv_tokens(min(head, window), block) if head else 0
    if not shared:
        per_replica = -(-smallest // window)
        tiled = smallest // per_replica // block * block
        if tiled >= TILE_SHRINK_LIMIT * window:  # smaller prefixes no longer hold big sections
            window = tiled
    reserve = base.concurrency_reserve_tokens or 0
    rooms = sum(room_tokens(c) for c in replicas) - (len(replicas) - 1) * shared
    return base.model_copy(
        update={
            "kv_cache_tokens": rooms + reserve,
            "context_limit_tokens": window,
            "resident_budget_tokens": min(base.resident_budget_tokens, window),
            "reasoning": f"{len(replicas)} replicas planned as one KV cache; {base.reasoning}",
        }
    )


def routed_shares(prefixes: Sequence[PlanPrefix]) -> dict[str, float]:
    """Each prefix's share of the routed traffic: its own sections' share, plus the shared
    head's (the sections in every prefix) split evenly, since any of them answers those."""
    if len(prefixes) < 2:
        return {p.id: p.traffic_share for p in prefixes}
    head = set.intersection(*(set(p.section_ids) for p in prefixes))
    head_share = sum(i.probability for i in prefixes[0].resident if i.section_id in head)
    return {
        p.id: max(p.traffic_share - head_share, 0.0) + head_share / len(prefixes) for p in prefixes
    }


def assign(plan: ResidencyPlan, replicas: Sequence[CapacitySnapshot]) -> Assignment:
    """Place `plan`'s prefixes on `replicas` (in position order)."""
    block = plan.capacity.block_size
    shared = plan.arithmetic.shared_kv_tokens if plan.arithmetic else 0
    prefixes = plan.all_prefixes()
    shares = routed_shares(prefixes)
    demands = [PrefixDemand(p.id, round_up(p.tokens, block), shares[p.id]) for p in prefixes]
    rooms = [ReplicaRoom(i, room_tokens(c)) for i, c in enumerate(replicas)]
    return place_prefixes(demands, rooms, shared)


def placement_of(assignment: Assignment, replicas: Sequence[CapacitySnapshot]) -> Placement:
    """The plan.json record of an assignment."""
    return Placement(
        replicas=tuple(
            ReplicaPlacement(
                position=i,
                host=c.host,
                kv_cache_tokens=c.kv_cache_tokens,
                room_tokens=room_tokens(c),
                prefix_ids=assignment.held[i],
                resident_kv_tokens=assignment.used_tokens[i],
                load_share=round(assignment.loads[i], 6),
            )
            for i, c in enumerate(replicas)
        ),
        method=PLACEMENT_METHOD,
    )


def plan_fleet(
    plan_once: PlanOnce,
    replicas: Sequence[CapacitySnapshot],
    prefixes: int | None = None,
    shared_tokens: int | None = None,
) -> ResidencyPlan:
    """The fleet's plan with its placement: as many prefixes as the replicas hold whole
    (`shared_tokens`: --shared-tokens, None: the planner's default head)."""
    capacity = fleet_capacity(replicas, shared_tokens)
    plan = plan_once(capacity, prefixes)
    while (assignment := assign(plan, replicas)).unplaced:
        count = len(plan.all_prefixes()) - len(assignment.unplaced)
        if prefixes is not None or count < 1:
            raise InfeasiblePlanError(
                f"--replicas {len(replicas)}: prefixes {', '.join(assignment.unplaced)} fit on "
                f"no replica (rooms {', '.join(str(room_tokens(c)) for c in replicas)} tokens); "
                "lower --prefixes or --concurrency"
            )
        plan = plan_once(capacity, count)
    placed = plan.model_copy(
        update={"capacity": replicas[0], "placement": placement_of(assignment, replicas)}
    )
    return ResidencyPlan.model_validate(placed.model_dump())
