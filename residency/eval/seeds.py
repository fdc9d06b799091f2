"""Coverage over several draws: the mean row of random residency's draws, and every row's mean
and standard deviation over `--seeds` simulated traffics (one seed can flatter a strategy)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from residency.eval.coverage import (
    CoverageMetrics,
    CoverageReport,
    RowAcrossSeeds,
    SeedStat,
    StrategyResult,
)

RANDOM_DRAWS = 10


def mean_metrics(metrics: Sequence[CoverageMetrics]) -> CoverageMetrics:
    """Field-wise mean (counts rounded; long-tail recall over the draws that have one)."""
    n = len(metrics)
    recalls = [m.long_tail_recall for m in metrics if m.long_tail_recall is not None]
    return CoverageMetrics(
        questions=round(sum(m.questions for m in metrics) / n),
        coverage=sum(m.coverage for m in metrics) / n,
        coverage_all=sum(m.coverage_all for m in metrics) / n,
        resident_share=sum(m.resident_share for m in metrics) / n,
        retrieved_share=sum(m.retrieved_share for m in metrics) / n,
        long_tail_questions=round(sum(m.long_tail_questions for m in metrics) / n),
        long_tail_recall=sum(recalls) / len(recalls) if recalls else None,
        route_resident_share=sum(m.route_resident_share for m in metrics) / n,
        misrouted=round(sum(m.misrouted for m in metrics) / n),
        mean_added_chunks=sum(m.mean_added_chunks for m in metrics) / n,
        mean_added_tokens=sum(m.mean_added_tokens for m in metrics) / n,
        mean_prompt_tokens=sum(m.mean_prompt_tokens for m in metrics) / n,
        mean_uncached_tokens=sum(m.mean_uncached_tokens for m in metrics) / n,
    )


def mean_row(name: str, rows: Sequence[StrategyResult]) -> StrategyResult:
    """One row that is the mean of several draws of a strategy (random residency)."""
    n = len(rows)
    types = sorted({t for r in rows for t in r.by_type})
    predicted = [r.predicted_resident_share for r in rows if r.predicted_resident_share is not None]
    rescued = [r.rag_misses_rescued for r in rows if r.rag_misses_rescued is not None]
    return rows[0].model_copy(
        update={
            "name": name,
            "resident_sections": round(sum(r.resident_sections for r in rows) / n),
            "resident_chunks": round(sum(r.resident_chunks for r in rows) / n),
            "prefix_tokens": round(sum(r.prefix_tokens for r in rows) / n),
            "predicted_resident_share": sum(predicted) / len(predicted) if predicted else None,
            "rag_misses_rescued": sum(rescued) / len(rescued) if rescued else None,
            "overall": mean_metrics([r.overall for r in rows]),
            "by_type": {
                t: mean_metrics([r.by_type[t] for r in rows if t in r.by_type]) for t in types
            },
        }
    )


def _stat(values: Sequence[float]) -> SeedStat:
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return SeedStat(mean=statistics.fmean(values), sd=sd)


def across_seeds(reports: Sequence[CoverageReport]) -> tuple[RowAcrossSeeds, ...]:
    """Every row's mean and sd over the reports of several traffic seeds (same rows)."""
    names = [r.name for r in reports[0].results]
    out = []
    for name in names:
        picked = [next(r for r in rep.results if r.name == name) for rep in reports]
        rows = [r.overall for r in picked]
        rescued = [r.rag_misses_rescued for r in picked if r.rag_misses_rescued is not None]
        out.append(
            RowAcrossSeeds(
                name=name,
                seeds=len(reports),
                coverage=_stat([m.coverage for m in rows]),
                coverage_all=_stat([m.coverage_all for m in rows]),
                resident_share=_stat([m.resident_share for m in rows]),
                mean_added_tokens=_stat([m.mean_added_tokens for m in rows]),
                mean_prompt_tokens=_stat([m.mean_prompt_tokens for m in rows]),
                mean_uncached_tokens=_stat([m.mean_uncached_tokens for m in rows]),
                rag_misses_rescued=_stat(rescued) if rescued else None,
            )
        )
    return tuple(out)
