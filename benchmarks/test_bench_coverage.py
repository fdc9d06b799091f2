"""Coverage targets on JSQuAD v1.3 valid: the planner against every baseline in one run.

`residency eval coverage --squad valid-v1.3.json --budget 30000` with its defaults (BM25-only
index, Zipf s 1.1, 4,000 log / 2,000 eval draws, seed 0, the router's k, margin and hedge). The
table goes to ``extra_info`` and, with the whole report, to ``.benchmarks/coverage-jsquad.json``.

Targets (issue 4): planner coverage >= 0.985 and >= RAG-only top-3 + 4 points; fewer prompt
tokens beyond the prefix than RAG-only top-5. Issue 34, on the modelled RTX 4070 host
(`--kv-cache-tokens 132021 --max-model-len 32768 --concurrency 4`): several prefixes as served
cover at least what one prefix covers, and the top sections shown wherever they live
(`--spread 5`, the default) neither lower coverage nor push the uncached tokens per question
above one prefix's without them (`--spread 0`, the routing before). The lead over RAG top-3 is
out of reach at seed 0 with BM25-only retrieval (see its xfail); it is a strict xfail, so it
fails (to be re-marked) the day it is met. Evidence: /tmp/coverage_report.md.

    .venv/bin/python -m pytest benchmarks/test_bench_coverage.py --benchmark-only
"""

from __future__ import annotations

import functools
from typing import Any

import orjson
import pytest
from conftest import JSQUAD_VALID, REPO_ROOT

from residency.atomic import write_bytes_atomic
from residency.context.routing import RoutingSettings
from residency.eval.coverage import CoverageReport, StrategyResult
from residency.eval.coverage_options import CoverageOptions
from residency.eval.coverage_runs import SimulationJob, run_simulation

BUDGET_TOKENS = 30_000
COVERAGE_TARGET = 0.985
LEAD_OVER_RAG_TOP3 = 0.04
RESULTS_PATH = REPO_ROOT / ".benchmarks/coverage-jsquad.json"


class _Quiet:
    """No progress output."""

    def start(self, description: str, total: int) -> None:
        """Nothing to show."""

    def advance(self, steps: int) -> None:
        """Nothing to show."""


HOST = {"kv_cache_tokens": 132_021, "max_model_len": 32_768, "concurrency": 4}


@functools.cache
def host_comparison(spread: int) -> CoverageReport:
    """The modelled host's rows (single-prefix, residency) at seed 0, routed with `spread`."""
    routing = RoutingSettings(spread=spread)
    options = CoverageOptions(budget_tokens=BUDGET_TOKENS, routing=routing, **HOST)
    return run_simulation(SimulationJob(JSQUAD_VALID, options), _Quiet())


@functools.cache
def comparison() -> CoverageReport:
    """The JSQuAD comparison, run once per session (the benchmark times the first call)."""
    return run_simulation(
        SimulationJob(JSQUAD_VALID, CoverageOptions(budget_tokens=BUDGET_TOKENS)), _Quiet()
    )


@pytest.fixture
def report() -> CoverageReport:
    if not JSQUAD_VALID.is_file():
        pytest.skip(f"JSQuAD v1.3 valid not found at {JSQUAD_VALID} (set RESIDENCY_JSQUAD_VALID)")
    return comparison()


def row(report: CoverageReport, name: str) -> StrategyResult:
    return next(r for r in report.results if r.name == name)


def table(report: CoverageReport) -> list[dict[str, Any]]:
    """The comparison table as plain rows."""
    return [
        {
            "strategy": r.name,
            "k": r.k,
            "coverage": round(r.overall.coverage, 4),
            "in_prefix": round(r.overall.resident_share, 4),
            "long_tail_recall": r.overall.long_tail_recall,
            "misrouted": r.overall.misrouted,
            "route_resident": round(r.overall.route_resident_share, 4),
            "mean_added_tokens": round(r.overall.mean_added_tokens, 1),
            "resident_sections": r.resident_sections,
            "prefix_tokens": r.prefix_tokens,
        }
        for r in report.results
    ]


def test_jsquad_coverage_comparison(benchmark: Any) -> None:
    """One run of every strategy; the token target and the sanity of the comparison."""
    if not JSQUAD_VALID.is_file():
        pytest.skip(f"JSQuAD v1.3 valid not found at {JSQUAD_VALID} (set RESIDENCY_JSQUAD_VALID)")
    result = benchmark.pedantic(comparison, rounds=1, iterations=1)
    rows = table(result)
    benchmark.extra_info["table"] = rows
    benchmark.extra_info["simulation"] = result.simulation.model_dump() if result.simulation else {}
    RESULTS_PATH.parent.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(
        RESULTS_PATH,
        orjson.dumps(
            {"table": rows, "report": result.model_dump(mode="json")}, option=orjson.OPT_INDENT_2
        ),
    )
    assert result.settings.embedder is None  # the default BM25-only index
    assert {r.overall.questions for r in result.results} == {2000}
    assert all(r.prefix_tokens <= BUDGET_TOKENS for r in result.results)
    planner, rag5 = row(result, "planner"), row(result, "rag-top5")
    # Target: fewer prompt tokens beyond the cached prefix than RAG-only top-5.
    assert planner.overall.mean_added_tokens < rag5.overall.mean_added_tokens
    # The log is worth something: more evidence in the prefix than any log-free residency.
    for name in ("cag", "random", "density"):
        assert planner.overall.resident_share > row(result, name).overall.resident_share + 0.3


def test_planner_coverage_target(report: CoverageReport) -> None:
    # Measured 0.9915 at seed 0 (0.978 before the router's hedge: 30 misrouted questions).
    assert row(report, "planner").overall.coverage >= COVERAGE_TARGET


@pytest.mark.xfail(
    strict=True,
    reason="seed 0, BM25-only: RAG-only top-3 already covers 0.958, so the target is 0.998, above "
    "the 0.9945 a planner that knows the true popularity reaches (same seed and router); "
    "measured 0.9915 (+3.35 points)",
)
def test_planner_lead_over_rag_top3(report: CoverageReport) -> None:
    lead = row(report, "planner").overall.coverage - row(report, "rag-top3").overall.coverage
    assert lead >= LEAD_OVER_RAG_TOP3


def test_several_prefixes_keep_what_one_prefix_shows(benchmark: Any) -> None:
    """Seed 0 on the modelled host: several prefixes >= one prefix, in coverage and coverage_all;
    the top sections lower neither and cost fewer uncached tokens than one prefix did before."""
    if not JSQUAD_VALID.is_file():
        pytest.skip(f"JSQuAD v1.3 valid not found at {JSQUAD_VALID} (set RESIDENCY_JSQUAD_VALID)")
    now = benchmark.pedantic(host_comparison, args=(RoutingSettings().spread,), rounds=1)
    before = host_comparison(0)
    served, single = row(now, "residency").overall, row(now, "single-prefix").overall
    benchmark.extra_info["table"] = table(now)
    benchmark.extra_info["uncached"] = {
        "residency": served.mean_uncached_tokens,
        "single-prefix": single.mean_uncached_tokens,
        "single-prefix spread 0": row(before, "single-prefix").overall.mean_uncached_tokens,
    }
    assert served.coverage >= single.coverage
    assert served.coverage_all >= single.coverage_all
    assert served.coverage >= row(before, "residency").overall.coverage
    assert served.mean_uncached_tokens <= row(before, "single-prefix").overall.mean_uncached_tokens
