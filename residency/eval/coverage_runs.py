"""The two runs of `residency eval coverage`: one existing plan over a questions file, or the
simulated side-by-side comparison of every strategy on a SQuAD-style file
(docs/design/evaluation.md).

The simulation imports the SQuAD file once into ``CACHE/coverage/squad-<sha>/corpus`` (CACHE:
the cache directory, residency/paths.py) and builds (or reuses) a BM25-only index beside it
(``--retriever hybrid`` opts into hybrid retrieval: the embedding takes minutes on 2 cores).
Token counts come from the project's tiny tokenizer, every strategy plans the same budget (block
size 16, no hybrid alignment) from the same simulated log, and every row is evaluated on the same
evaluation traffic with the same rankings.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from planner import Reserves
from planner.budget import compute_resident_budget
from residency.corpus.squad import import_squad, provenance_file, questions_file
from residency.errors import ConfigError
from residency.eval.coverage import (
    RAG_BASELINE_KS,
    CoverageReport,
    ResidentSet,
    StrategyResult,
    evaluate_coverage,
)
from residency.eval.coverage_options import CoverageOptions, TrafficOptions
from residency.eval.defaults import COVERAGE_CACHE
from residency.eval.questions import load_questions
from residency.eval.seeds import RANDOM_DRAWS, across_seeds, mean_row
from residency.eval.traffic import simulate_traffic
from residency.index import BuildProgress, Index, IndexOptions, build_index, open_index
from residency.index.manifest import MANIFEST_FILE, read_manifest
from residency.models.tokenizer import ensure_tokenizer
from residency.planning.build import PlanOptions, build_plan, log_mass
from residency.planning.fleet import plan_fleet
from residency.planning.grouping import co_asked, merge_affinity
from residency.planning.multi import build_prefix_plan
from residency.planning.plan_model import (
    CapacitySnapshot,
    LogSummary,
    ResidencyPlan,
    plan_index_dir,
    read_plan,
)
from residency.planning.run import CACHE_DIR, DATA_ROOT, index_closeness
from residency.planning.scoring import DEFAULT_DEPTH, DEFAULT_PRIOR_WEIGHT
from residency.planning.settings import Strategy
from residency.query_log import LogEntry
from residency.tokenizer import ApproxTokenizer, LocalTokenizer, ModelTokenizer, reopen_tokenizer

SIM_BLOCK_SIZE = 16
# Comparison rows after the RAG-only baselines, in table order.
PLANNED: tuple[Strategy, ...] = ("cag", "random", "frequency", "density", "planner")
STRATEGIES: tuple[Strategy, ...] = ("rag", *PLANNED)


def _tokenizer_for_plan(
    label: str, index: Index, tokenizer_dir: Path | None, notes: list[str]
) -> ModelTokenizer:
    """--tokenizer-dir, else the plan's local tokenizer, else the index's, else the labelled
    approximation."""
    if tokenizer_dir is not None:
        return LocalTokenizer(tokenizer_dir)
    found = reopen_tokenizer(label, index.manifest.token_count, server=False)
    if found is not None:
        return found
    notes.append(
        f"added tokens are approximate: the plan's tokenizer ({label}) is not a local "
        "directory here; pass --tokenizer-dir"
    )
    return ApproxTokenizer()


def evaluate_plan_files(
    plan_paths: Sequence[Path],
    questions_path: Path,
    *,
    index_dir: Path | None = None,
    tokenizer_dir: Path | None = None,
    options: CoverageOptions | None = None,
    progress: BuildProgress | None = None,
) -> CoverageReport:
    """Coverage of plan.json files made from one corpus (e.g. several prefixes and
    `--prefixes 1`) side by side on a questions file, against the first plan's index, routed
    with `options.routing` (default: the router's), beside rag-top`k` at the same k."""
    route = options or CoverageOptions()
    if not plan_paths:
        raise ConfigError("--plan: give at least one plan.json")
    for path in plan_paths:
        if not path.is_file():
            raise ConfigError(f"--plan {path}: no such file")
    if not questions_path.is_file():
        raise ConfigError(f"--questions {questions_path}: no such file")
    plans = [read_plan(path) for path in plan_paths]
    directory = index_dir or plan_index_dir(plans[0], plan_paths[0])
    index = open_index(directory)
    known = {c.id for c in index.chunks}
    for path, plan in zip(plan_paths, plans, strict=True):
        _check_plan_index(path, plan, index, known)
    notes: list[str] = []
    encoder = _tokenizer_for_plan(plans[0].prefix.tokenizer, index, tokenizer_dir, notes)
    questions = load_questions(questions_path)
    k = route.routing.k
    rows = [ResidentSet.from_plan(plan, k) for plan in plans]
    names = [r.name for r in rows]
    rows = [
        replace(r, name=f"{r.name} ({path.stem})"[:64]) if names.count(r.name) > 1 else r
        for r, path in zip(rows, plan_paths, strict=True)
    ]
    rag = f"rag-top{k}"
    if rag not in names:  # RAG at the router's k: the baseline at equal k
        rows.append(ResidentSet(rag, "rag", frozenset(), 0, 0, k))
    if progress is not None:
        progress.start("ranking questions", len({q.query for q in questions if q.relevant_ids}))
    return evaluate_coverage(
        index,
        questions,
        rows,
        encoder,
        source=str(questions_path),
        routing=route.routing,
        notes=notes,
        progress=progress.advance if progress else None,
    )


def _check_plan_index(path: Path, plan: ResidencyPlan, index: Index, known: set[str]) -> None:
    """Refuse a plan made from another corpus, or from chunks this index no longer has."""
    if index.manifest.corpus_hash != plan.corpus_hash:
        raise ConfigError(
            f"--plan {path} was made from corpus {plan.corpus_hash[:12]}, but index "
            f"{index.directory} holds corpus {index.manifest.corpus_hash[:12]}: re-plan against "
            "this index, or pass the plan's own index (--index-dir)"
        )
    missing = sorted(plan.resident_chunk_ids() - known)
    if missing:
        raise ConfigError(
            f"--plan {path}: {len(missing)} of {len(plan.resident_chunk_ids())} resident "
            f"chunk ids (e.g. {missing[0]}) are not in index {index.directory}, which was "
            "re-chunked since: re-plan against it"
        )


@dataclass(frozen=True)
class SimulationJob:
    """What the simulated comparison was asked."""

    squad_file: Path
    # Budget, routing and the modelled host (--kv-cache-tokens, --max-model-len, --concurrency:
    # adds the rows 'single-prefix', one prefix of the host's window, and 'residency', prefixes
    # as served), validated together.
    options: CoverageOptions = field(default_factory=CoverageOptions)
    traffic: TrafficOptions = field(default_factory=TrafficOptions)
    index_dir: Path | None = None
    dense: bool = False
    depth: int = DEFAULT_DEPTH
    prior_weight: float = DEFAULT_PRIOR_WEIGHT
    cache_dir: Path = COVERAGE_CACHE


def host_capacity(kv_cache_tokens: int, max_model_len: int, concurrency: int) -> CapacitySnapshot:
    """A modelled host: the default per-request reserves, block size 16, no hybrid alignment."""
    reserves = Reserves(concurrent_requests=concurrency)
    budget = compute_resident_budget(
        max_model_len=max_model_len,
        kv_cache_tokens=kv_cache_tokens,
        block_size=SIM_BLOCK_SIZE,
        reserves=reserves,
        align_to_blocks=False,
    )
    return CapacitySnapshot(
        model="simulation",
        host=f"modelled: {kv_cache_tokens} KV tokens, max_model_len {max_model_len}",
        max_model_len=max_model_len,
        kv_cache_tokens=kv_cache_tokens,
        block_size=SIM_BLOCK_SIZE,
        is_hybrid=False,
        resident_budget_tokens=budget.resident_budget_tokens,
        binding_constraint=budget.binding_constraint,
        reasoning=budget.reasoning,
        context_limit_tokens=budget.context_limit_tokens,
        concurrency_reserve_tokens=budget.concurrency_reserve_tokens,
        concurrent_requests=concurrency,
        per_request_tokens=reserves.per_request_tokens,
    )


def simulation_capacity(budget_tokens: int) -> CapacitySnapshot:
    """A capacity snapshot that is just the budget: block size 16, no hybrid alignment."""
    return CapacitySnapshot(
        model="simulation",
        host="simulation",
        max_model_len=budget_tokens,
        kv_cache_tokens=budget_tokens,
        block_size=SIM_BLOCK_SIZE,
        is_hybrid=False,
        resident_budget_tokens=budget_tokens,
        binding_constraint="max_model_len",
        reasoning=f"simulated resident budget of {budget_tokens} tokens (--budget)",
    )


def squad_corpus(squad_file: Path, cache_dir: Path) -> Path:
    """The imported corpus of `squad_file` (its questions beside it), imported once per
    content."""
    if not squad_file.is_file():
        raise ConfigError(f"--squad {squad_file}: no such file")
    digest = hashlib.sha256(squad_file.read_bytes()).hexdigest()[:16]
    out = cache_dir / f"squad2-{digest}" / "corpus"  # 2: questions beside the corpus
    if not provenance_file(out).is_file():
        import_squad(squad_file, out, force=True)
    return out


def squad_index(
    docs: Path, index_dir: Path, dense: bool, counter: LocalTokenizer, progress: BuildProgress
) -> tuple[Index, bool]:
    """Open the index of `docs` at `index_dir` if it was built the same way, else (re)build it."""
    if (index_dir / MANIFEST_FILE).is_file():
        manifest = read_manifest(index_dir)
        if manifest.corpus_dir != str(docs.resolve()):
            raise ConfigError(
                f"--index-dir {index_dir} holds an index of {manifest.corpus_dir}, not of the "
                f"imported corpus {docs}: pass another --index-dir, or none (one under --cache-dir)"
            )
        options = IndexOptions(dense=dense)
        same_build = (
            manifest.token_count == counter.info
            and manifest.chunker == options.chunker
            and manifest.sparse_tokenizer == options.sparse_tokenizer
            and (manifest.embedder.name if manifest.embedder else None)
            == (options.embedder if dense else None)
        )
        if same_build:
            return open_index(index_dir), True
    build_index(docs, index_dir, IndexOptions(dense=dense), counter, progress)
    return open_index(index_dir), False


def run_simulation(job: SimulationJob, progress: BuildProgress) -> CoverageReport:
    """Import, index, simulate traffic, plan every strategy at one budget, evaluate side by side."""
    opts = job.options
    corpus = squad_corpus(job.squad_file, job.cache_dir)
    tokenizer_dir = ensure_tokenizer(DATA_ROOT, CACHE_DIR / "tiny-models")
    default_dir = corpus.parent / ("index-dense" if job.dense else "index-bm25")
    index_dir = job.index_dir or default_dir
    index, reused = squad_index(
        corpus, index_dir, job.dense, LocalTokenizer(tokenizer_dir), progress
    )
    traffic = simulate_traffic(load_questions(questions_file(corpus)), job.traffic)
    progress.start("attributing the log", 1)
    mass = log_mass(index, traffic.log, job.depth)
    progress.advance(1)
    encoder = LocalTokenizer(tokenizer_dir)
    capacity = simulation_capacity(opts.budget_tokens)
    summary = LogSummary(
        path=None,
        entries=len(traffic.log),
        total_count=sum(e.count for e in traffic.log),
        skipped=0,
    )
    host = None
    if opts.kv_cache_tokens is not None and opts.max_model_len is not None:
        host = host_capacity(opts.kv_cache_tokens, opts.max_model_len, opts.concurrency)
    rows = _strategy_sets(job, index, mass, capacity, encoder, summary, progress)
    if host is not None:
        rows += _host_sets(job, index, mass, host, encoder, summary, traffic.log)
    retrieval = (
        "hybrid (dense + BM25)"
        if job.dense
        else "BM25-only (--retriever hybrid: dense + BM25, as the router)"
    )
    notes = [
        f"index {'reused' if reused else 'built'}: {index.directory}; retrieval {retrieval}",
        f"tokens counted with the tiny tokenizer {tokenizer_dir.name}",
        f"planner scoring: attribution depth {job.depth}, prior weight {job.prior_weight:g}",
    ]
    notes.append(f"random: the mean of {RANDOM_DRAWS} draws")
    progress.start("ranking eval questions", len({q.query for q in traffic.eval_questions}))
    report = evaluate_coverage(
        index,
        traffic.eval_questions,
        rows,
        encoder,
        source=f"simulated from {job.squad_file}",
        routing=opts.routing,
        budget_tokens=opts.budget_tokens,
        simulation=traffic.stats,
        notes=notes,
        progress=progress.advance,
    )
    return _merge_draws(report)


def _strategy_sets(
    job: SimulationJob,
    index: Index,
    mass: Mapping[str, float],
    capacity: CapacitySnapshot,
    encoder: ModelTokenizer,
    summary: LogSummary,
    progress: BuildProgress,
) -> list[ResidentSet]:
    """Every strategy planned at the simulation's budget: RAG at each k, the planned ones,
    random residency as several draws."""
    opts = job.options
    progress.start("planning", len(STRATEGIES))
    plans = {}
    for strategy in STRATEGIES:
        options = PlanOptions(
            strategy=strategy,
            seed=job.traffic.seed,
            depth=job.depth,
            prior_weight=job.prior_weight,
            log_summary=summary,
        )
        plans[strategy] = build_plan(index, mass, capacity, encoder, options)
        progress.advance(1)
    rag_ks = sorted({*RAG_BASELINE_KS, opts.routing.k})  # RAG at the router's k too: equal k
    rows = [ResidentSet.from_plan(plans["rag"], k) for k in rag_ks]
    for s in PLANNED:
        if s != "random":
            rows.append(ResidentSet.from_plan(plans[s], opts.routing.k))
            continue
        for draw in range(RANDOM_DRAWS):  # random residency: the mean of several draws
            options = PlanOptions(
                strategy="random",
                seed=job.traffic.seed * RANDOM_DRAWS + draw,
                depth=job.depth,
                prior_weight=job.prior_weight,
                log_summary=summary,
            )
            drawn = build_plan(index, mass, capacity, encoder, options)
            rows.append(ResidentSet.from_plan(drawn, opts.routing.k, name=f"random#{draw}"))
    return rows


def _host_sets(
    job: SimulationJob,
    index: Index,
    mass: Mapping[str, float],
    host: CapacitySnapshot,
    encoder: ModelTokenizer,
    summary: LogSummary,
    log: Sequence[LogEntry],
) -> list[ResidentSet]:
    """On the modelled host: one prefix of its window ('single-prefix') and the prefixes as
    served ('residency')."""
    k = job.options.routing.k
    options = PlanOptions(depth=job.depth, prior_weight=job.prior_weight, log_summary=summary)
    single = build_plan(index, mass, host, encoder, options)
    single_row = ResidentSet.from_plan(single, k, name="single-prefix")
    memo: dict[str, list[str]] = {}

    def search(query: str, n: int) -> list[str]:
        if query not in memo:
            memo[query] = [h.section_id for h in index.search(query, job.depth)]
        return memo[query][:n]

    affinity = merge_affinity(co_asked(log, search, job.depth), index_closeness(index))
    served = build_prefix_plan(index, mass, affinity, host, encoder, options)
    rows = [single_row, ResidentSet.from_plan(served, k, name="residency")]
    if (replicas := job.options.replicas) > 1:  # questions go to a replica holding their prefix
        fleet = plan_fleet(
            lambda c, n: build_prefix_plan(index, mass, affinity, c, encoder, options, n),
            [host] * replicas,
        )
        rows.append(ResidentSet.from_plan(fleet, k, name=f"placement-{replicas}"))
    return rows


def _merge_draws(report: CoverageReport) -> CoverageReport:
    """The report with the random draws' rows merged into one 'random' row, in place."""
    draws = [r for r in report.results if r.name.startswith("random#")]
    merged: list[StrategyResult] = []
    for r in report.results:
        if r is draws[0]:
            merged.append(mean_row("random", draws))
        elif r not in draws:
            merged.append(r)
    return report.model_copy(update={"results": tuple(merged)})


def run_simulations(job: SimulationJob, seeds: int, progress: BuildProgress) -> CoverageReport:
    """`run_simulation` over `seeds` traffic seeds (seed, seed + 1, ...): the first seed's
    report, with every row's mean and sd over all of them."""
    if seeds < 1:
        raise ConfigError(f"--seeds {seeds}: run at least one traffic seed")
    reports = []
    for n in range(seeds):
        traffic = job.traffic.model_copy(update={"seed": job.traffic.seed + n})
        reports.append(run_simulation(replace(job, traffic=traffic), progress))
    if seeds == 1:
        return reports[0]
    return reports[0].model_copy(update={"across_seeds": across_seeds(reports)})
