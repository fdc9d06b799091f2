"""`residency bench`: cold vs warm TTFT per prompt length on a live vLLM, coverage vs budget.

May import: planner, the cross-cutting modules, capacity, context, corpus, eval, index, models,
planning, retrieval, serve, status, timex, warm.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from residency.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from residency.bench.coverage_curve import DEFAULT_BUDGET_FRACTIONS, coverage_vs_budget
    from residency.bench.options import DEFAULT_LENGTHS, BenchOptions
    from residency.bench.plot import plot_bench, render_png
    from residency.bench.report import (
        BenchReport,
        CoverageCurve,
        CoveragePoint,
        LengthResult,
        dump_report,
        load_report,
        write_report,
    )
    from residency.bench.ttft import check_lengths, run_bench

__all__ = [
    "DEFAULT_BUDGET_FRACTIONS",
    "DEFAULT_LENGTHS",
    "BenchOptions",
    "BenchReport",
    "CoverageCurve",
    "CoveragePoint",
    "LengthResult",
    "check_lengths",
    "coverage_vs_budget",
    "dump_report",
    "load_report",
    "plot_bench",
    "render_png",
    "run_bench",
    "write_report",
]

__getattr__ = lazy_exports(__name__, __file__)
