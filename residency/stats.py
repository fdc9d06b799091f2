"""Order statistics of measured times: the one percentile definition residency uses, and the one
summary model of a set of timings (`TimingStats`: bench's TTFTs, the pruner's call latencies)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field


def percentile(values: Sequence[float], q: float) -> float:
    """The q-quantile (0 <= q <= 1) by linear interpolation between order statistics: numpy's
    default ("linear", Hyndman & Fan type 7), what `statistics.quantiles(method="inclusive")`
    gives at its cut points. `values` need not be sorted.

    >>> percentile([4.0, 1.0, 2.0], 0.5), percentile([1.0, 2.0, 4.0, 8.0], 0.5)
    (2.0, 3.0)
    """
    if not values:
        raise ValueError("percentile of no values")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"percentile q={q}: must be within 0..1")
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


class TimingStats(BaseModel):
    """Order statistics of a set of timings, in seconds (percentiles by `percentile`); n = 0
    when nothing was timed, every figure then 0."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    n: int = Field(ge=0, le=10_000_000, description="Samples.")
    mean_s: float = Field(ge=0, le=86_400, description="Mean, seconds.")
    median_s: float = Field(ge=0, le=86_400, description="Median (p50), seconds.")
    p10_s: float = Field(ge=0, le=86_400, description="10th percentile, seconds.")
    p90_s: float = Field(ge=0, le=86_400, description="90th percentile, seconds.")
    p95_s: float = Field(ge=0, le=86_400, description="95th percentile, seconds.")
    min_s: float = Field(ge=0, le=86_400, description="Fastest sample, seconds.")
    max_s: float = Field(ge=0, le=86_400, description="Slowest sample, seconds.")

    @classmethod
    def of(cls, samples_s: Sequence[float]) -> TimingStats:
        """The statistics of `samples_s` (zeros with n = 0 for none)."""
        if not samples_s:
            return cls(n=0, mean_s=0, median_s=0, p10_s=0, p90_s=0, p95_s=0, min_s=0, max_s=0)
        return cls(
            n=len(samples_s),
            mean_s=statistics.fmean(samples_s),
            median_s=percentile(samples_s, 0.5),
            p10_s=percentile(samples_s, 0.1),
            p90_s=percentile(samples_s, 0.9),
            p95_s=percentile(samples_s, 0.95),
            min_s=min(samples_s),
            max_s=max(samples_s),
        )
