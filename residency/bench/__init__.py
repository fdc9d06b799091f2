"""`residency bench`: cold vs warm TTFT per prompt length on a live vLLM, coverage vs budget.

May import: planner, the cross-cutting modules, capacity, corpus, eval, index, models, planning,
retrieval, serve, timex, warm.
"""

from residency.bench.coverage_curve import DEFAULT_BUDGET_FRACTIONS, coverage_vs_budget
from residency.bench.plot import plot_bench, render_png
from residency.bench.report import (
    BenchReport,
    CoverageCurve,
    CoveragePoint,
    LengthResult,
    TtftStats,
    dump_report,
    load_report,
    write_report,
)
from residency.bench.ttft import DEFAULT_LENGTHS, BenchOptions, check_lengths, run_bench

__all__ = [
    "DEFAULT_BUDGET_FRACTIONS",
    "DEFAULT_LENGTHS",
    "BenchOptions",
    "BenchReport",
    "CoverageCurve",
    "CoveragePoint",
    "LengthResult",
    "TtftStats",
    "check_lengths",
    "coverage_vs_budget",
    "dump_report",
    "load_report",
    "plot_bench",
    "render_png",
    "run_bench",
    "write_report",
]
