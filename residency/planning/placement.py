"""Placement: which replica of a fleet holds which resident prefix (pure, no I/O).

Each replica has its own KV room (its KV cache less what its concurrent requests need). Every
prefix is placed once where it fits on the least loaded replica, hottest first (sharding: the
fleet's resident set grows with the replicas); then the room left holds more copies of the
hottest prefixes, a prefix of traffic share t (of the total) up to ceil(t * N) copies, each copy
on the least loaded replica that does not hold it yet. A replica's load is the traffic of the
prefixes it holds, each prefix's share split evenly over its copies.

Prefixes that start with the same shared head (planning/multi.py) cost a replica that head's
whole blocks once: the first prefix on a replica costs all of its blocks, each further one its
blocks less `shared_kv_tokens`.

Worked example: prefixes p0 (0.5 of the traffic, 400 KV tokens), p1 (0.3, 400), p2 (0.2, 400)
on two replicas of 900 tokens, no head: p0 -> r0, p1 -> r1, p2 -> r1 (r1's load 0.3 < r0's 0.5);
p0 may take ceil(0.5 * 2) = 1 copy, so nothing is replicated: loads 0.5 and 0.5, all three
prefixes (1,200 tokens) resident where replication would hold two (800) on each.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PrefixDemand:
    """One prefix to place: its KV tokens (whole blocks) and its share of the traffic."""

    id: str
    kv_tokens: int
    traffic_share: float


@dataclass(frozen=True, slots=True)
class ReplicaRoom:
    """One replica: the KV tokens its resident prefixes may take."""

    position: int
    room_tokens: int


@dataclass(frozen=True, slots=True)
class Assignment:
    """The result: the prefix ids each replica holds (by position), and the ones none could."""

    held: tuple[tuple[str, ...], ...]
    used_tokens: tuple[int, ...]
    loads: tuple[float, ...]
    unplaced: tuple[str, ...]

    def copies(self, prefix_id: str) -> int:
        """How many replicas hold `prefix_id`."""
        return sum(prefix_id in ids for ids in self.held)


class _Fleet:
    """The assignment under construction."""

    def __init__(self, replicas: Sequence[ReplicaRoom], shared_kv_tokens: int) -> None:
        self.replicas = list(replicas)
        self.shared = shared_kv_tokens
        self.held: list[list[PrefixDemand]] = [[] for _ in replicas]

    def used(self, r: int) -> int:
        held = self.held[r]
        return sum(p.kv_tokens for p in held) - max(len(held) - 1, 0) * self.shared

    def cost(self, r: int, p: PrefixDemand) -> int:
        return p.kv_tokens - (self.shared if self.held[r] else 0)

    def fits(self, r: int, p: PrefixDemand) -> bool:
        holds = any(q.id == p.id for q in self.held[r])
        return not holds and self.used(r) + self.cost(r, p) <= self.replicas[r].room_tokens

    def copies(self, p: PrefixDemand) -> int:
        return sum(any(q.id == p.id for q in held) for held in self.held)

    def load(self, r: int) -> float:
        return sum(p.traffic_share / max(self.copies(p), 1) for p in self.held[r])

    def add_to_least_loaded(self, p: PrefixDemand) -> bool:
        fit = [r for r in range(len(self.replicas)) if self.fits(r, p)]
        if not fit:
            return False
        best = min(fit, key=lambda r: (self.load(r), self.used(r), self.replicas[r].position))
        self.held[best].append(p)
        return True


def place_prefixes(
    prefixes: Sequence[PrefixDemand],
    replicas: Sequence[ReplicaRoom],
    shared_kv_tokens: int = 0,
) -> Assignment:
    """Shard every prefix once (hottest first, least loaded replica where it fits), then
    replicate the hottest in proportion to their traffic share within the room left."""
    if not replicas:
        raise ValueError("place_prefixes needs at least one replica")
    fleet = _Fleet(replicas, shared_kv_tokens)
    hottest = sorted(prefixes, key=lambda p: (-p.traffic_share, p.id))
    unplaced = [p.id for p in hottest if not fleet.add_to_least_loaded(p)]
    total = sum(p.traffic_share for p in prefixes) or 1.0
    n = len(replicas)
    wanted = {p.id: math.ceil(p.traffic_share / total * n - 1e-9) for p in hottest}
    while True:
        # the prefix whose copies carry the most traffic each, among those still short of copies
        short = [
            p
            for p in hottest
            if p.id not in unplaced
            and fleet.copies(p) < wanted[p.id]
            and any(fleet.fits(r, p) for r in range(n))
        ]
        if not short:
            break
        p = max(short, key=lambda p: p.traffic_share / fleet.copies(p))
        fleet.add_to_least_loaded(p)
    order = {p.id: i for i, p in enumerate(prefixes)}
    return Assignment(
        held=tuple(tuple(sorted((p.id for p in h), key=order.__getitem__)) for h in fleet.held),
        used_tokens=tuple(fleet.used(r) for r in range(n)),
        loads=tuple(fleet.load(r) for r in range(n)),
        unplaced=tuple(unplaced),
    )
