"""Section scores from the query log: query frequency, answer density and the planner's value.

Definitions (the README repeats them):

- **Query frequency** `freq(s)`: each logged query (with its count c) is retrieved over the whole
  corpus with the hybrid retriever and its mass c is split over the top `depth` sections with
  weights proportional to 1/rank^2 (rank-weighted attribution: 1, 1/4, 1/9 normalised, so the
  top hit takes 73% at depth 3: retrieval misses still leave some mass on the runners-up
  without a confident top hit being diluted). `freq(s)`
  is the share of all logged mass that lands on s (sums to 1 over sections).
- **Evidence probability** `p(s)`: the probability that the evidence of the *next* question lies
  in s, the frequency smoothed toward a uniform prior over sections with `prior_weight`
  pseudo-queries: p(s) = (mass(s) + prior_weight / N) / (total + prior_weight). With an empty
  log p is uniform.
- **Answer density** `density(s) = p(s) / tokens(s)`: expected evidence per token. The planner
  maximises sum p(s) over resident sections under the token budget (a 0/1 knapsack whose
  greedy order is exactly density); density-only planning (no log) ranks by 1 / tokens(s).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from residency.query_log import LogEntry

DEFAULT_DEPTH = 3
DEFAULT_PRIOR_WEIGHT = 1.0


@dataclass(frozen=True, slots=True)
class SectionScore:
    """Scores of one section."""

    section_id: str
    tokens: int
    mass: float  # attributed logged queries
    frequency: float  # share of logged mass
    probability: float  # smoothed evidence probability p(s)

    @property
    def density(self) -> float:
        """Expected evidence per token."""
        return self.probability / max(self.tokens, 1)


def attribute_queries(
    entries: Sequence[LogEntry],
    search: Callable[[str, int], Sequence[str]],
    depth: int = DEFAULT_DEPTH,
) -> dict[str, float]:
    """Split each entry's count over its top-`depth` sections with 1/rank^2 weights."""
    weights = [1.0 / r**2 for r in range(1, depth + 1)]
    mass: dict[str, float] = {}
    for entry in entries:
        ids = list(search(entry.query, depth))[:depth]
        if not ids:
            continue
        norm = sum(weights[: len(ids)])
        for rank, sid in enumerate(ids):
            mass[sid] = mass.get(sid, 0.0) + entry.count * weights[rank] / norm
    return mass


def score_sections(
    sections: Sequence[tuple[str, int]],
    mass: dict[str, float],
    prior_weight: float = DEFAULT_PRIOR_WEIGHT,
) -> list[SectionScore]:
    """Frequency and smoothed probability of every (section id, tokens), in the given order."""
    n = max(len(sections), 1)
    total = sum(mass.get(sid, 0.0) for sid, _ in sections)
    denominator = total + prior_weight if total + prior_weight > 0 else 1.0
    return [
        SectionScore(
            section_id=sid,
            tokens=tokens,
            mass=mass.get(sid, 0.0),
            frequency=mass.get(sid, 0.0) / total if total > 0 else 0.0,
            probability=(mass.get(sid, 0.0) + prior_weight / n) / denominator,
        )
        for sid, tokens in sections
    ]
