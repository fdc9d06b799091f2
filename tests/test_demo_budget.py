"""The demo's time budget: the prefill-rate fit and the TTFT lengths it keeps (no server)."""

from __future__ import annotations

import pytest

from residency.demo.budget import (
    LENGTH_LADDER,
    MIN_LENGTHS,
    LengthChoice,
    PrefillRate,
    choose_lengths,
    fit_prefill_rate,
    row_cost_s,
)

# The slowest 2-core host seen (bf16 emulated): 512 tokens in 2.07 s, 2,048 in 8.79 s.
SLOW = fit_prefill_rate([(512, 2.07), (2048, 8.79)])
# A fast one (AMX-BF16): 512 in 0.40 s, 2,048 in 1.90 s (budget.py's worked example).
FAST = fit_prefill_rate([(512, 0.40), (2048, 1.90)])


def test_the_fit_reproduces_the_worked_example() -> None:
    assert FAST.per_token_s == pytest.approx(7.3e-4, rel=0.02)
    assert FAST.cold_s(4000) == pytest.approx(4.46, rel=0.02)
    assert 4000 / SLOW.cold_s(4000) < 250  # the slow host really is slow


def _choose(rate: PrefillRate, seconds_left: float, plan_tokens: int = 6000) -> LengthChoice:
    return choose_lengths(
        rate,
        seconds_left,
        max_model_len=8192,
        plan_tokens=plan_tokens,
        cold_repeats=2,
        warm_sends=4,
    )


@pytest.mark.parametrize("rate", [SLOW, FAST], ids=["slow", "fast"])
@pytest.mark.parametrize("seconds_left", [-5.0, 0.0, 1.0, 10.0])
def test_a_budget_too_small_still_shows_the_two_shortest_lengths(
    rate: PrefillRate, seconds_left: float
) -> None:
    choice = _choose(rate, seconds_left)
    assert choice.lengths == LENGTH_LADDER[:MIN_LENGTHS]
    assert choice.scaled_down is not None
    assert "prefix row" in choice.scaled_down  # the plan row costs more than is left
    assert "raise --time-budget" in choice.scaled_down
    floor = sum(row_cost_s(rate, n, 2, 4) for n in LENGTH_LADDER[:MIN_LENGTHS])
    if floor > seconds_left:
        assert "measured past the --time-budget" in choice.scaled_down
    assert choice.predicted_s == pytest.approx(floor)


def test_a_generous_budget_keeps_every_length_the_window_allows() -> None:
    choice = _choose(FAST, 10_000.0)
    assert choice.lengths == (1000, 2000, 4000, 8000)
    assert choice.include_plan
    assert choice.scaled_down == "16,000, 30,000 exceed max_model_len 8,192"


def test_lengths_are_added_shortest_first_while_they_fit() -> None:
    floor = sum(row_cost_s(SLOW, n, 2, 4) for n in (1000, 2000))
    plan = row_cost_s(SLOW, 6000, 2, 4)
    four_k = row_cost_s(SLOW, 4000, 2, 4)
    choice = _choose(SLOW, floor + plan + four_k + 0.1)
    assert (choice.lengths, choice.include_plan) == ((1000, 2000, 4000), True)
    assert choice.scaled_down is not None
    assert choice.scaled_down.startswith("left out 8,000 tokens")
