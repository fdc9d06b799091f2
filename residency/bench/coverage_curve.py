"""Coverage vs resident budget for the planner and the baselines, on a plan's own index and log.

At each budget (fractions of the plan's budget) every strategy is planned with the plan's
capacity snapshot, its index and its query log, and scored with `residency eval coverage`'s
machinery (`evaluate_resident_set`: the router's routing at k / margin / hedge, same rankings
for every row) on a questions file with gold `relevant_ids`. RAG-only top-k keeps nothing
resident, so its coverage is the same at every budget. Budgets too small for the instructions
are skipped.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from planner import InfeasiblePlanError
from residency.bench.report import CoverageCurve, CoveragePoint
from residency.context.routing import DEFAULT_HEDGE, DEFAULT_K, DEFAULT_MARGIN, RoutingSettings
from residency.errors import ConfigError
from residency.eval.coverage import (
    RAG_BASELINE_KS,
    ResidentSet,
    StrategyResult,
    chunk_token_counts,
    evaluate_resident_set,
    rank_queries,
)
from residency.eval.defaults import DEFAULT_PREFETCH
from residency.eval.questions import load_questions
from residency.index import BuildProgress, Index, open_index
from residency.planning.build import PlanOptions, build_plan, log_mass
from residency.planning.plan_model import ResidencyPlan
from residency.planning.settings import Strategy
from residency.query_log import LogEntry, merge_by_time, read_query_log
from residency.tokenizer import ApproxTokenizer, MemoTokenizer, ModelTokenizer, reopen_tokenizer

DEFAULT_BUDGET_FRACTIONS: tuple[float, ...] = (0.125, 0.25, 0.5, 0.75, 1.0)
CURVE_STRATEGIES: tuple[Strategy, ...] = ("planner", "frequency", "density", "random", "cag")


def plan_tokenizer(plan: ResidencyPlan, index: Index, notes: list[str]) -> ModelTokenizer:
    """The tokenizer the plan was made with: local dir, server, the index's, else approximate."""
    found = reopen_tokenizer(plan.prefix.tokenizer, index.manifest.token_count)
    if found is not None:
        return found
    notes.append(
        f"token counts are approximate: the plan's tokenizer ({plan.prefix.tokenizer}) is not "
        "reachable"
    )
    return ApproxTokenizer()


def _open_plan_index(plan: ResidencyPlan, questions_path: Path) -> Index:
    """The plan's index, checked to hold the corpus it was planned from (and the questions
    file to exist)."""
    if not questions_path.is_file():
        raise ConfigError(f"--questions {questions_path}: no such file")
    index = open_index(Path(plan.index_dir))
    if index.manifest.corpus_hash != plan.corpus_hash:
        raise ConfigError(
            f"the plan was made from corpus {plan.corpus_hash[:12]}, but its index "
            f"{plan.index_dir} now holds {index.manifest.corpus_hash[:12]}: re-plan"
        )
    return index


def _plan_mass(plan: ResidencyPlan, index: Index, notes: list[str]) -> dict[str, float]:
    """The log mass of the plan's own query log, where it is readable here (else none)."""
    entries: tuple[LogEntry, ...] = ()
    paths = [f.path for f in plan.log.files] or ([plan.log.path] if plan.log.path else [])
    if paths and all(Path(p).is_file() for p in paths):
        entries = merge_by_time([read_query_log(Path(p)) for p in paths]).entries
    else:
        notes.append("the plan's query log is not readable here: density-only planning")
    return log_mass(index, entries) if entries else {}


def _point(row: StrategyResult, budget: int) -> CoveragePoint:
    """One strategy's coverage at one budget."""
    return CoveragePoint(
        strategy=row.name,
        budget_tokens=budget,
        prefix_tokens=row.prefix_tokens,
        coverage=row.overall.coverage,
        resident_share=row.overall.resident_share,
    )


def coverage_vs_budget(
    plan: ResidencyPlan,
    questions_path: Path,
    *,
    fractions: Sequence[float] = DEFAULT_BUDGET_FRACTIONS,
    k: int = DEFAULT_K,
    margin: int = DEFAULT_MARGIN,
    hedge: int = DEFAULT_HEDGE,
    prefetch: int = DEFAULT_PREFETCH,
    progress: BuildProgress | None = None,
) -> CoverageCurve:
    """Coverage of every strategy at budgets `fractions` x the plan's budget."""
    index = _open_plan_index(plan, questions_path)
    notes: list[str] = []
    mass = _plan_mass(plan, index, notes)
    encoder = MemoTokenizer(plan_tokenizer(plan, index, notes))
    answerable = [q for q in load_questions(questions_path) if q.relevant_ids]
    if progress is not None:
        progress.start("ranking questions", len({q.query for q in answerable}))
    rankings = rank_queries(
        index, [q.query for q in answerable], prefetch, progress.advance if progress else None
    )
    tokens = chunk_token_counts(index, encoder)
    routing = RoutingSettings(k=k, margin=margin, hedge=hedge, prefetch=max(prefetch, k))
    budgets = sorted({max(1, int(plan.capacity.resident_budget_tokens * f)) for f in fractions})
    if progress is not None:
        progress.start("planning budgets", len(budgets) * len(CURVE_STRATEGIES) + 1)
    points: list[CoveragePoint] = []

    def score(resident: ResidentSet, budget: int) -> None:
        row = evaluate_resident_set(index, answerable, rankings, resident, tokens, routing)
        points.append(_point(row, budget))

    for budget in budgets:
        capacity = plan.capacity.model_copy(update={"resident_budget_tokens": budget})
        for strategy in CURVE_STRATEGIES:
            options = PlanOptions(strategy=strategy, log_summary=plan.log)
            try:
                planned = build_plan(index, mass, capacity, encoder, options)
            except InfeasiblePlanError:
                notes.append(f"budget {budget}: too small for {strategy}; skipped")
                continue
            finally:
                if progress is not None:
                    progress.advance(1)
            score(ResidentSet.from_plan(planned, k), budget)
    rag = build_plan(index, mass, plan.capacity, encoder, PlanOptions(strategy="rag"))
    for rag_k in RAG_BASELINE_KS:
        for budget in budgets:
            score(ResidentSet.from_plan(rag, rag_k), budget)
    if progress is not None:
        progress.advance(1)
    return CoverageCurve(
        questions_source=str(questions_path),
        questions=len(answerable),
        log_source=plan.log.path,
        plan_budget_tokens=plan.capacity.resident_budget_tokens,
        points=tuple(points),
        notes=tuple(dict.fromkeys(notes)),
    )
