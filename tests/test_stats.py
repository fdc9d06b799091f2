"""The one percentile definition (residency/stats.py) against numpy's, and the timing summary
built on it (bench's TTFTs, the pruner's latencies)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from residency.stats import TimingStats, percentile

finite = st.floats(min_value=0, max_value=1e6, allow_nan=False)


@given(values=st.lists(finite, min_size=1, max_size=60), q=st.floats(min_value=0, max_value=1))
def test_percentile_is_numpys_linear_interpolation(values: list[float], q: float) -> None:
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, 100 * q)), abs=1e-9)


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [
        pytest.param([4.0, 1.0, 2.0], 0.5, 2.0, id="median-of-3-unsorted"),
        pytest.param([1.0, 2.0, 4.0, 8.0], 0.5, 3.0, id="median-of-4-interpolates"),
        pytest.param([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], 0.1, 1.5, id="p10-of-6"),
        pytest.param([7.0], 0.9, 7.0, id="one-value"),
    ],
)
def test_percentile_worked_examples(values: list[float], q: float, expected: float) -> None:
    assert percentile(values, q) == pytest.approx(expected)


@pytest.mark.parametrize(("values", "q"), [([], 0.5), ([1.0], 1.5)], ids=["no-values", "q>1"])
def test_percentile_refuses(values: list[float], q: float) -> None:
    with pytest.raises(ValueError, match="percentile"):
        percentile(values, q)


def test_timing_stats_of_twenty_calls() -> None:
    # 0.1 .. 2.0 s: p95 sits at rank 0.95 x 19 = 18.05, between 1.9 and 2.0 -> 1.905.
    stats = TimingStats.of([0.1 * i for i in range(20, 0, -1)])
    assert stats.n == 20
    assert stats.mean_s == pytest.approx(1.05)
    assert stats.median_s == pytest.approx(1.05)
    assert stats.p10_s == pytest.approx(0.29)
    assert stats.p90_s == pytest.approx(1.81)
    assert stats.p95_s == pytest.approx(1.905)
    assert (stats.min_s, stats.max_s) == pytest.approx((0.1, 2.0))


def test_timing_stats_of_nothing_is_zeros() -> None:
    stats = TimingStats.of([])
    assert stats.n == 0
    assert stats.model_dump(exclude={"n"}) == dict.fromkeys(
        ("mean_s", "median_s", "p10_s", "p90_s", "p95_s", "min_s", "max_s"), 0.0
    )
