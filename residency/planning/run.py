"""`residency plan` end to end: capacity, index, log, tokenizer, selection, plan.json.

The built-in default (no --index, no --corpus) plans the project's sample corpus
(`corpora/harbor-lights`) with its query log; its index is built on first use under `.cache/`
and reused, and token counts come from the project's tiny tokenizer trained on that corpus.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from residency.capacity.report import CapacityReport, CapacityRequest, build_capacity_report
from residency.corpus.chunking import ChunkerSettings
from residency.corpus.samples import JA_SAMPLE, SampleCorpus
from residency.corpus.samples import REPO_ROOT as REPO_ROOT
from residency.errors import ConfigError
from residency.index import BuildProgress, Index, IndexOptions, build_index, open_index
from residency.models.tokenizer import ensure_tokenizer
from residency.planning.build import PlanOptions, build_plan, log_mass
from residency.planning.plan_model import CapacitySnapshot, LogSummary, ResidencyPlan, Strategy
from residency.query_log import LogRead, read_query_log
from residency.tokenizer import ApproxTokenizer, LocalTokenizer, ModelTokenizer, ServerTokenizer

SAMPLE_CORPUS = JA_SAMPLE.docs
SAMPLE_LOG = JA_SAMPLE.queries
CACHE_DIR = REPO_ROOT / ".cache"


@dataclass(frozen=True)
class PlanJob:
    """What `residency plan` was asked beyond the capacity flags."""

    capacity: CapacityRequest
    index_dir: Path | None = None
    sample: SampleCorpus = JA_SAMPLE  # the corpus planned when no index_dir is given
    log: Path | None = None
    tokenizer_dir: Path | None = None
    strategy: Strategy = "planner"
    pins: tuple[str, ...] = ()
    excludes: tuple[str, ...] = ()
    seed: int = 0
    warnings: list[str] = field(default_factory=list)


def snapshot(report: CapacityReport) -> CapacitySnapshot:
    """The capacity numbers a plan records."""
    inputs = report.inputs
    host = inputs.gpu or inputs.server or "--kv-cache-memory-bytes"
    return CapacitySnapshot(
        model=inputs.model,
        host=host,
        max_model_len=inputs.settings.max_model_len,
        kv_cache_tokens=report.kv_cache_tokens,
        block_size=report.block_size,
        is_hybrid=inputs.linear_attention_layers > 0,
        resident_budget_tokens=report.resident_budget_tokens,
        binding_constraint=report.binding_constraint,
        reasoning=report.reasoning,
    )


def sample_index_options(sample: SampleCorpus, dense: bool = True) -> IndexOptions:
    """How a sample corpus is indexed (its chunk size; dense + BM25 unless `dense` is False)."""
    if sample.chunk_chars is None:
        return IndexOptions(dense=dense)
    chunker = ChunkerSettings(chunk_chars=sample.chunk_chars)
    return IndexOptions(dense=dense, chunker=chunker)


def sample_index(progress: BuildProgress | None, sample: SampleCorpus = JA_SAMPLE) -> Index:
    """A sample corpus's index under .cache/ (dense + BM25), refreshed on every use: the
    rebuild is incremental (unchanged chunks keep their vectors), so an edited sample corpus is
    never planned from a stale index and an unchanged one costs a fraction of a second."""
    name = "sample-index" if sample == JA_SAMPLE else f"sample-index-{sample.name}"
    index_dir = CACHE_DIR / name
    tokenizer_dir = ensure_tokenizer(REPO_ROOT, CACHE_DIR / "tiny-models")
    options = sample_index_options(sample)
    build_index(sample.docs, index_dir, options, LocalTokenizer(tokenizer_dir), progress)
    return open_index(index_dir)


def encoder_for(job: PlanJob, index: Index, sample: bool) -> ModelTokenizer:
    """The tokenizer the prefix is counted and hashed with."""
    if job.capacity.server:
        return ServerTokenizer(job.capacity.server)
    if job.tokenizer_dir is not None:
        return LocalTokenizer(job.tokenizer_dir)
    if sample:
        return LocalTokenizer(ensure_tokenizer(REPO_ROOT, CACHE_DIR / "tiny-models"))
    if index.manifest.token_count.method == "tokenizer":
        return LocalTokenizer(Path(index.manifest.token_count.name))
    job.warnings.append(
        "no tokenizer: prefix tokens are approximate (pass --tokenizer-dir or --server)"
    )
    return ApproxTokenizer()


def read_log(job: PlanJob, sample: bool) -> LogRead | None:
    """The query log, or None (density-only planning, with a warning)."""
    path = job.log or (job.sample.queries if sample else None)
    if path is None:
        job.warnings.append("no --log: density-only planning (every section equally likely)")
        return None
    if not path.exists():
        raise ConfigError(f"--log {path}: no such file")
    log = read_query_log(path)
    if not log.entries:
        job.warnings.append(f"--log {path} holds no usable line: density-only planning")
    for line in log.skipped[:5]:
        job.warnings.append(f"skipped {line}")
    return log


def run_plan(
    job: PlanJob, progress: BuildProgress | None = None
) -> tuple[CapacityReport, ResidencyPlan]:
    """Capacity, then residency: the plan for `job` (not yet written)."""
    report = build_capacity_report(job.capacity)
    sample = job.index_dir is None
    if job.index_dir is None:
        index = sample_index(progress, job.sample)
    else:
        index = open_index(job.index_dir)
    log = read_log(job, sample)
    entries = log.entries if log else ()
    mass = log_mass(index, entries) if entries else {}
    summary = LogSummary(
        path=str(job.log or (job.sample.queries if sample else "")) or None,
        entries=len(entries),
        total_count=log.total_count if log else 0,
        skipped=len(log.skipped) if log else 0,
    )
    options = PlanOptions(
        strategy=job.strategy,
        pins=job.pins,
        excludes=job.excludes,
        seed=job.seed,
        log_summary=summary,
    )
    plan = build_plan(index, mass, snapshot(report), encoder_for(job, index, sample), options)
    return report, plan
