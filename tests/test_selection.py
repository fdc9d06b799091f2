"""Resident selection (0/1 knapsack) against a brute-force oracle, with pins and exclusions."""

from __future__ import annotations

import itertools
import random

import pytest

from planner import InfeasiblePlanError
from planner.selection import Candidate, select_resident


def brute_force(items: list[Candidate], budget: int) -> float:
    """The optimal value by trying every subset (oracle for small inputs)."""
    best = 0.0
    for r in range(len(items) + 1):
        for subset in itertools.combinations(items, r):
            if sum(c.tokens for c in subset) <= budget:
                best = max(best, sum(c.value for c in subset))
    return best


@pytest.mark.parametrize("seed", range(8), ids=lambda s: f"seed{s}")
def test_selection_is_optimal_on_small_random_instances(seed: int) -> None:
    rng = random.Random(seed)
    items = [Candidate(f"s{i}", rng.randint(5, 120), rng.random()) for i in range(12)]
    budget = rng.randint(100, 400)
    result = select_resident(items, budget)
    assert result.resident_tokens <= budget
    assert result.value == pytest.approx(brute_force(items, budget))
    assert sum(c.value for c in items if c.id in result.resident_ids) == pytest.approx(result.value)


def test_greedy_path_reports_a_valid_gap_bound() -> None:
    rng = random.Random(42)
    items = [Candidate(f"s{i}", rng.randint(5, 60), rng.random()) for i in range(12)]
    result = select_resident(items, 200, dp_cells=1)  # too small a table: greedy only
    assert result.method == "greedy"
    optimum = brute_force(items, 200)
    assert result.value <= optimum + 1e-9
    assert optimum - result.value <= result.optimality_gap_bound + 1e-9


def test_pins_are_always_resident_and_exclusions_never() -> None:
    items = [
        Candidate("faq", 50, 0.0, pinned=True),
        Candidate("hot", 40, 10.0, excluded=True),
        Candidate("a", 40, 1.0),
        Candidate("b", 40, 2.0),
    ]
    result = select_resident(items, 100)
    assert result.resident_ids == ("faq", "b")  # corpus order, pinned included
    assert result.resident_tokens == 90


def test_pins_over_budget_are_infeasible_with_both_numbers() -> None:
    items = [Candidate("faq", 70, 1.0, pinned=True), Candidate("glossary", 50, 1.0, pinned=True)]
    with pytest.raises(InfeasiblePlanError, match=r"120 tokens.*budget is 100.*--pin"):
        select_resident(items, 100)
