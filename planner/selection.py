"""Choose the resident sections: a 0/1 knapsack over section values under a token budget.

Each candidate has a value (its expected share of query evidence, see `residency/plan/scoring`)
and a weight (its tokens in the rendered prefix). Residency maximises expected coverage =
the sum of the values of the resident sections.

- Greedy by value per token (then the best single item if it beats the greedy set), always.
- Dynamic programming over weights rounded *up* to a granularity chosen so the table stays
  under `dp_cells` (exact at granularity 1; rounding up never overruns the budget); the better
  of the two sets wins.
- Bound (Dantzig): OPT <= the fractional-knapsack optimum, so `optimality_gap_bound` =
  fractional optimum - chosen value is a certificate of how far from optimal the set can be.

Pinned items are always resident (their tokens come off the budget first); excluded items never.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from planner.errors import InfeasiblePlanError
from planner.units import cdiv


@dataclass(frozen=True, slots=True)
class Candidate:
    """One section (or section part) that may be made resident."""

    id: str
    tokens: int
    value: float
    pinned: bool = False
    excluded: bool = False


@dataclass(frozen=True, slots=True)
class Selection:
    """The resident ids and how they were chosen."""

    resident_ids: tuple[str, ...]
    resident_tokens: int
    value: float
    method: Literal["dp", "greedy"]
    optimality_gap_bound: float


def select_resident(
    candidates: Sequence[Candidate],
    budget_tokens: int,
    *,
    dp_cells: int = 4_000_000,
) -> Selection:
    """Maximise the summed value of resident candidates with total tokens <= budget_tokens."""
    pinned = [c for c in candidates if c.pinned]
    pinned_tokens = sum(c.tokens for c in pinned)
    if pinned_tokens > budget_tokens:
        names = ", ".join(c.id for c in pinned[:5]) + (" ..." if len(pinned) > 5 else "")
        raise InfeasiblePlanError(
            f"pinned sections take {pinned_tokens} tokens but the resident budget is "
            f"{budget_tokens}; unpin some (--pin: {names}) or raise the budget "
            "(--max-model-len, --reserve-*, --gpu-memory-utilization)"
        )
    room = budget_tokens - pinned_tokens
    free = [c for c in candidates if not c.pinned and not c.excluded and 0 < c.tokens <= room]
    chosen, upper_bound = _knapsack_greedy(free, room)
    method: Literal["dp", "greedy"] = "greedy"
    if free and room > 0:
        # Weights are rounded up to `granularity` so the table fits in `dp_cells`; with
        # granularity 1 the DP is exact. Keep whichever of DP and greedy is better.
        granularity = max(1, cdiv(len(free) * room, dp_cells))
        if granularity <= 64:
            dp = _knapsack_dp(free, room // granularity, granularity)
            if sum(c.value for c in dp) > sum(c.value for c in chosen):
                chosen, method = dp, "dp"
    resident = {c.id for c in pinned} | {c.id for c in chosen}
    value = sum(c.value for c in chosen)
    return Selection(
        resident_ids=tuple(c.id for c in candidates if c.id in resident),
        resident_tokens=pinned_tokens + sum(c.tokens for c in chosen),
        value=sum(c.value for c in pinned) + value,
        method=method,
        optimality_gap_bound=max(upper_bound - value, 0.0),
    )


def _knapsack_dp(items: Sequence[Candidate], steps: int, granularity: int) -> list[Candidate]:
    """Exact 0/1 knapsack over weights rounded up to `granularity` tokens."""
    if steps <= 0 or not items:
        return []
    weights = [cdiv(c.tokens, granularity) for c in items]
    best = [0.0] * (steps + 1)
    keep: list[bytearray] = []
    for item, w in zip(items, weights, strict=True):
        took = bytearray(steps + 1)
        if w <= steps and item.value > 0:
            # Descending capacities read best[cap - w] before this item can have changed it.
            for cap in range(steps, w - 1, -1):
                cand = best[cap - w] + item.value
                if cand > best[cap]:
                    best[cap] = cand
                    took[cap] = 1
        keep.append(took)
    chosen: list[Candidate] = []
    cap = steps
    for i in range(len(items) - 1, -1, -1):
        if keep[i][cap]:
            chosen.append(items[i])
            cap -= weights[i]
    return chosen


def _knapsack_greedy(items: Sequence[Candidate], room: int) -> tuple[list[Candidate], float]:
    """Greedy by value per token, then the best single item if it beats the set.

    Also returns the fractional (LP) optimum, an upper bound on the 0/1 optimum (Dantzig).
    """
    ranked = sorted((c for c in items if c.value > 0), key=lambda c: (-c.value / c.tokens, c.id))
    chosen: list[Candidate] = []
    used = 0
    upper_bound = 0.0
    filled = 0
    for c in ranked:
        if filled < room:
            take = min(c.tokens, room - filled)
            upper_bound += c.value * take / c.tokens
            filled += take
        if used + c.tokens <= room:
            chosen.append(c)
            used += c.tokens
    best_single = max(ranked, key=lambda c: c.value, default=None)
    if best_single is not None and best_single.value > sum(c.value for c in chosen):
        chosen = [best_single]
    return chosen, upper_bound
