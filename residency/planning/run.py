"""`residency plan` end to end: capacity, index, log, tokenizer, selection, plan.json.

The built-in default (no --index, no --corpus) plans the project's sample corpus
(`residency/data/corpora/harbor-lights`) with its query log; its index is built on first use
under the cache directory (residency/paths.py) and reused, and token counts come from the
project's tiny tokenizer trained on that corpus.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from planner.kv_layout import batched_tokens
from residency.capacity.report import CapacityReport, build_capacity_report
from residency.capacity.request import CapacityRequest
from residency.corpus.chunker_settings import ChunkerSettings
from residency.corpus.samples import DATA_ROOT as DATA_ROOT
from residency.corpus.samples import EN_SAMPLE, JA_SAMPLE, SampleCorpus
from residency.index import BuildProgress, Index, IndexOptions, build_index, open_index
from residency.index.store import RetrievalBackend
from residency.models.tokenizer import ensure_tokenizer
from residency.paths import cache_root
from residency.planning.build import PlanOptions
from residency.planning.grouping import Pair, closeness, co_asked, merge_affinity
from residency.planning.multi import build_prefix_plan
from residency.planning.plan_model import (
    BlockPool,
    CapacitySnapshot,
    LogFileSummary,
    LogSummary,
    ResidencyPlan,
)
from residency.planning.scoring import DEFAULT_DEPTH, attribute_queries
from residency.planning.settings import PlanSettings
from residency.query_log import LogRead, expand_log_patterns, merge_by_time, read_query_log
from residency.tokenizer import ApproxTokenizer, LocalTokenizer, ModelTokenizer, ServerTokenizer

SAMPLE_CORPUS = JA_SAMPLE.docs
SAMPLE_LOG = JA_SAMPLE.queries
CACHE_DIR = cache_root()


@dataclass(frozen=True)
class PlanJob:
    """What `residency plan` was asked beyond the capacity flags."""

    capacity: CapacityRequest
    index_dir: Path | None = None
    # The corpus planned when no index_dir is given; None: the Japanese sample, or with --server
    # the one the served model reads (`choose_sample`).
    sample: SampleCorpus | None = None
    logs: tuple[str, ...] = ()  # --log files or globs (several routers' logs merge by time)
    tokenizer_dir: Path | None = None
    settings: PlanSettings = field(default_factory=PlanSettings)  # strategy, --prefixes, seed
    pins: tuple[str, ...] = ()
    excludes: tuple[str, ...] = ()
    backend: RetrievalBackend | None = None  # attribution through it (e.g. Qdrant), not FAISS
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
        context_limit_tokens=report.plan.budget.context_limit_tokens,
        concurrency_reserve_tokens=report.plan.budget.concurrency_reserve_tokens,
        concurrent_requests=inputs.reserves.concurrent_requests,
        per_request_tokens=inputs.reserves.per_request_tokens,
        block_pool=_block_pool(report),
    )


def _block_pool(report: CapacityReport) -> BlockPool | None:
    """The shared pool of a hybrid model in align mode (None: the token rule is exact)."""
    layout = report.plan.layout
    kinds = [g.kind for g in layout.groups]
    if layout.mamba_cache_mode != "align" or "sliding_attention" in kinds:
        return None
    return BlockPool(
        num_blocks=report.num_blocks,
        attention_groups=kinds.count("full_attention"),
        state_groups=kinds.count("linear_attention"),
        prefill_chunk_tokens=batched_tokens(report.inputs.settings),
        retention_interval=_retention_interval(report),
    )


def _retention_interval(report: CapacityReport) -> int | None:
    """The server's --prefix-cache-retention-interval label; vLLM's default 0 otherwise."""
    labels = report.server.cache_config_info if report.server is not None else {}
    label = labels.get("prefix_cache_retention_interval", "0")
    if label == "None":
        return None
    return int(label) if label.isdigit() else 0


def sample_index_options(sample: SampleCorpus, dense: bool = True) -> IndexOptions:
    """How a sample corpus is indexed (its chunk size; dense + BM25 unless `dense` is False)."""
    if sample.chunk_chars is None:
        return IndexOptions(dense=dense)
    chunker = ChunkerSettings(chunk_chars=sample.chunk_chars)
    return IndexOptions(dense=dense, chunker=chunker)


def sample_index(
    progress: BuildProgress | None,
    sample: SampleCorpus = JA_SAMPLE,
    backend: RetrievalBackend | None = None,
) -> Index:
    """A sample corpus's index under the cache directory (dense + BM25), refreshed on every use: the
    rebuild is incremental (unchanged chunks keep their vectors), so an edited sample corpus is
    never planned from a stale index and an unchanged one costs a fraction of a second."""
    name = "sample-index" if sample == JA_SAMPLE else f"sample-index-{sample.name}"
    index_dir = CACHE_DIR / name
    tokenizer_dir = ensure_tokenizer(DATA_ROOT, CACHE_DIR / "tiny-models")
    options = sample_index_options(sample)
    build_index(sample.docs, index_dir, options, LocalTokenizer(tokenizer_dir), progress)
    return open_index(index_dir, backend=backend)


def encoder_for(job: PlanJob, index: Index, sample: bool) -> ModelTokenizer:
    """The tokenizer the prefix is counted and hashed with."""
    if job.capacity.server:
        return ServerTokenizer(job.capacity.server)
    if job.tokenizer_dir is not None:
        return LocalTokenizer(job.tokenizer_dir)
    if sample:
        job.warnings.append(
            "the prefix is counted and hashed with residency's own demo tokenizer (trained on the "
            "sample corpus), not a served model's: pass --server or --tokenizer-dir to plan for "
            "your model"
        )
        return LocalTokenizer(ensure_tokenizer(DATA_ROOT, CACHE_DIR / "tiny-models"))
    if index.manifest.token_count.method == "tokenizer":
        return LocalTokenizer(Path(index.manifest.token_count.name))
    job.warnings.append(
        "no tokenizer: prefix tokens are approximate (pass --tokenizer-dir or --server)"
    )
    return ApproxTokenizer()


# A Japanese sentence: a tokenizer that knows Japanese spends about one token per character or
# fewer; an English-first one falls back to bytes (SmolLM2: ~2.5 tokens per character).
_JA_PROBE = "灯台の霧笛は濃霧のときに鳴り、保守記録には毎月の点検結果が書かれている。"
JA_TOKENS_PER_CHAR_LIMIT = 1.2


def choose_sample(job: PlanJob) -> SampleCorpus:
    """The sample corpus planned when no --index or --sample is given: the Japanese one, or
    with --server the English one when the served model's tokenizer does not read Japanese.
    Either way a warning says which and how to plan a corpus of one's own."""
    chosen, why = JA_SAMPLE, "the default"
    if job.capacity.server:
        tokenizer = ServerTokenizer(job.capacity.server)
        try:
            per_char = tokenizer.count(_JA_PROBE) / len(_JA_PROBE)
        finally:
            tokenizer.close()
        if per_char > JA_TOKENS_PER_CHAR_LIMIT:
            chosen = EN_SAMPLE
            why = (
                f"the served model spends {per_char:.1f} tokens per Japanese character (an "
                "English-first tokenizer)"
            )
        else:
            why = f"the served model reads Japanese ({per_char:.1f} tokens per character)"
    job.warnings.append(
        f"no --index: planning the built-in sample {chosen.name} ({why}); pass --index "
        "INDEX_DIR (`residency index`) to plan your corpus, or --sample to pick the sample"
    )
    return chosen


def read_log(
    job: PlanJob, corpus: SampleCorpus | None
) -> tuple[LogRead | None, tuple[LogFileSummary, ...]]:
    """The query log(s) merged by timestamp (--log; planning a sample corpus: its log), or None
    (density-only planning, with a warning)."""
    patterns = job.logs or ((str(corpus.queries),) if corpus is not None else ())
    if not patterns:
        job.warnings.append("no --log: density-only planning (every section equally likely)")
        return None, ()
    reads: list[LogRead] = []
    files: list[LogFileSummary] = []
    for path in expand_log_patterns(patterns):
        read = read_query_log(path)
        stamps = [e.ts for e in merge_by_time([read]).entries if e.ts is not None]
        reads.append(read)
        files.append(
            LogFileSummary(
                path=str(path),
                entries=len(read.entries),
                total_count=read.total_count,
                skipped=len(read.skipped),
                first_ts=stamps[0] if stamps else None,
                last_ts=stamps[-1] if stamps else None,
            )
        )
        if not read.entries:
            job.warnings.append(f"--log {path} holds no usable line")
    log = merge_by_time(reads)
    if not log.entries:
        job.warnings.append("no usable query-log line: density-only planning")
    for line in log.skipped[:5]:
        job.warnings.append(f"skipped {line}")
    return log, tuple(files)


def run_plan(
    job: PlanJob, progress: BuildProgress | None = None
) -> tuple[CapacityReport, ResidencyPlan]:
    """Capacity, then residency: the plan for `job` (not yet written)."""
    report = build_capacity_report(job.capacity)
    sample = job.index_dir is None
    corpus = None
    if job.index_dir is None:
        corpus = job.sample or choose_sample(job)
        index = sample_index(progress, corpus, job.backend)
    else:
        index = open_index(job.index_dir, backend=job.backend)
    log, files = read_log(job, corpus)
    encoder = encoder_for(job, index, sample)
    plan = plan_from_log(
        index, log, files, snapshot(report), encoder, job.settings, job.pins, job.excludes
    )
    return report, plan


def plan_from_log(
    index: Index,
    log: LogRead | None,
    files: tuple[LogFileSummary, ...],
    capacity: CapacitySnapshot,
    encoder: ModelTokenizer,
    settings: PlanSettings,
    pins: tuple[str, ...] = (),
    excludes: tuple[str, ...] = (),
) -> ResidencyPlan:
    """The residency part of `run_plan`: `log`'s questions attributed to sections, the
    sections chosen and grouped into prefixes within `capacity` (also what the router's
    re-planning calls with a window of its query log and the served plan's capacity)."""
    entries = log.entries if log else ()
    memo: dict[str, list[str]] = {}
    # one batch, through the on-disk cache: a re-plan of an unchanged log embeds nothing
    from residency.index.query_vectors import log_query_vectors  # numpy, faiss: when run

    vectors = log_query_vectors(index, (e.query for e in entries))

    def search(query: str, k: int) -> list[str]:
        if query not in memo:  # mass and co-asked pairs read the same top hits
            hits = index.search_all(query, DEFAULT_DEPTH, vectors.get(query))["hybrid"]
            memo[query] = [h.section_id for h in hits]
        return memo[query][:k]

    mass = attribute_queries(entries, search, DEFAULT_DEPTH) if entries else {}
    summary = LogSummary(
        path=files[0].path if files else None,
        entries=len(entries),
        total_count=log.total_count if log else 0,
        skipped=len(log.skipped) if log else 0,
        files=files,
    )
    options = PlanOptions(
        strategy=settings.strategy,
        pins=pins,
        excludes=excludes,
        seed=settings.seed,
        log_summary=summary,
    )
    affinity: dict[Pair, float] = {}
    if settings.strategy == "planner" and settings.prefixes != 1:
        affinity = merge_affinity(co_asked(entries, search, DEFAULT_DEPTH), index_closeness(index))
    return build_prefix_plan(
        index,
        mass,
        affinity,
        capacity,
        encoder,
        options,
        settings.prefixes,
        settings.shared_tokens,
    )


def index_closeness(index: Index) -> dict[Pair, float]:
    """Section pairs close in the index: each section's first chunk searched with BM25."""
    bm25 = index.retrievers().bm25
    firsts = [(s.id, chunks[0].text) for s in index.sections if (chunks := index.chunks_of(s.id))]

    def search(text: str, k: int) -> list[str]:
        ids = [index.section_of(h.id) for h in bm25.search(text, 2 * k)]
        return list(dict.fromkeys(ids))[:k]

    return closeness(firsts, search)
