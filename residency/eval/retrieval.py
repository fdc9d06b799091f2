"""Retrieval evaluation: section-level recall@k, MRR@10 and nDCG@10 of BM25, dense and fusion.

Rankings are section-level (chunk hits mapped to their section, first occurrence = rank), since a
question's gold evidence is a section. Questions with no relevant ids (type "unknown": the answer
is not in the corpus) are excluded from the metrics and counted separately. recall@k is the
share of a question's relevant sections in the top k, so a question with two gold sections scores
at most 0.5 at k=1; MRR@10 counts the first relevant one; nDCG@10 is binary. The metric functions
are pure; `evaluate_retrieval` runs the queries; a run is appended to an eval history (jsonl).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import re
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import orjson
from pydantic import BaseModel, ConfigDict, Field

from residency.atomic import append_line
from residency.errors import ConfigError
from residency.eval.defaults import METRICS
from residency.eval.questions import UNTYPED, Question
from residency.retrieval.metrics import (
    K_VALUES,
    mrr_at_k,
    ndcg_at_k,
    question_metrics,
    recall_at_k,
)

if TYPE_CHECKING:
    from residency.index import Index

__all__ = ["K_VALUES", "mrr_at_k", "ndcg_at_k", "question_metrics", "recall_at_k"]

MAX_K = 10
QUERY_BATCH = 64


class MetricSet(BaseModel):
    """Mean metrics over a set of questions."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    questions: int = Field(ge=0, description="Questions averaged.")
    recall_at_1: float = Field(ge=0.0, le=1.0, description="Mean recall@1.")
    recall_at_3: float = Field(ge=0.0, le=1.0, description="Mean recall@3.")
    recall_at_5: float = Field(ge=0.0, le=1.0, description="Mean recall@5.")
    recall_at_10: float = Field(ge=0.0, le=1.0, description="Mean recall@10.")
    mrr_at_10: float = Field(ge=0.0, le=1.0, description="Mean reciprocal rank, cut at 10.")
    ndcg_at_10: float = Field(ge=0.0, le=1.0, description="Mean binary nDCG@10.")

    def value(self, metric: str) -> float:
        """The value of 'R@10', 'MRR@10', ... (see METRICS)."""
        return float(getattr(self, METRICS[metric]))


def mean_metrics(rows: Sequence[dict[str, float]]) -> MetricSet:
    """The mean of per-question metrics (zeros for an empty set)."""
    fields = [f for f in MetricSet.model_fields if f != "questions"]
    means = {f: (sum(r[f] for r in rows) / len(rows) if rows else 0.0) for f in fields}
    return MetricSet(questions=len(rows), **means)


class RetrieverReport(BaseModel):
    """One retriever's metrics, overall and per question type."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    overall: MetricSet = Field(description="All evaluated questions.")
    by_type: dict[str, MetricSet] = Field(description="Per question type ('untyped' if none).")


class Budget(BaseModel):
    """A floor under one metric of the fusion (--min-recall R@10=0.80)."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    metric: str = Field(min_length=3, max_length=16, description="'R@10', 'MRR@10', ...")
    minimum: float = Field(ge=0.0, le=1.0, description="Lowest acceptable value.")
    actual: float | None = Field(default=None, ge=0.0, le=1.0, description="Measured value.")

    @property
    def passed(self) -> bool:
        """True when measured and not below the floor."""
        return self.actual is not None and self.actual >= self.minimum


def parse_budget(text: str) -> Budget:
    """'R@10=0.80' (also MRR@10=, nDCG@10=; case-insensitive) -> Budget."""
    match = re.fullmatch(r"\s*([A-Za-z]+@\d+)\s*=\s*([0-9.]+)\s*", text)
    names = {m.lower(): m for m in METRICS}
    if not match or match.group(1).lower() not in names:
        raise ConfigError(
            f"--min-recall {text!r}: expected METRIC=VALUE with METRIC one of "
            f"{', '.join(METRICS)}, e.g. R@10=0.80"
        )
    value = float(match.group(2))
    if not 0.0 <= value <= 1.0:
        raise ConfigError(f"--min-recall {text!r}: {value} is outside [0, 1]")
    return Budget(metric=names[match.group(1).lower()], minimum=value)


class EvalSettings(BaseModel):
    """What the evaluated retrieval looked like."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    embedder: str | None = Field(max_length=4096, description="Dense embedder (None: no dense).")
    sparse_tokenizer: str = Field(min_length=1, max_length=128, description="BM25 tokenizer.")
    weights: dict[str, float] = Field(description="Fusion weights per retriever.")
    prefetch: int = Field(ge=1, description="Candidates per retriever before fusion.")
    rrf_k: int = Field(ge=0, description="RRF k.")
    chunker: str = Field(min_length=1, max_length=256, description="e.g. fixed/256/32.")
    backend: str = Field(
        default="in-process",
        max_length=4096,
        description="Where the retrievers ran: 'in-process' or 'qdrant <location>/<collection>'.",
    )


class RetrievalEvalReport(BaseModel):
    """A whole `residency eval retrieval` run (also one eval-history record)."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    kind: str = Field(default="retrieval", max_length=32, description="History record kind.")
    timestamp: dt.datetime = Field(description="When the run finished (UTC).")
    index_dir: str = Field(min_length=1, max_length=4096, description="Index evaluated.")
    manifest_hash: str = Field(min_length=64, max_length=64, description="sha256 of manifest.")
    questions_file: str = Field(min_length=1, max_length=4096, description="Questions read.")
    questions_hash: str = Field(min_length=64, max_length=64, description="sha256 of that file.")
    questions_total: int = Field(ge=1, description="Questions in the file.")
    evaluated: int = Field(ge=0, description="Questions with relevant ids (in the metrics).")
    excluded_no_relevant: int = Field(ge=0, description="Questions with no relevant ids.")
    unknown_relevant_ids: tuple[str, ...] = Field(
        max_length=20, description="Relevant ids not in the index (first 20): always missed."
    )
    unknown_relevant_count: int = Field(ge=0, description="How many such ids in all.")
    settings: EvalSettings = Field(description="Retrieval settings.")
    retrievers: dict[str, RetrieverReport] = Field(description="'bm25', 'dense', 'hybrid'.")
    budgets: tuple[Budget, ...] = Field(default=(), description="--min-recall floors (hybrid).")


def evaluate_retrieval(
    index: Index,
    questions_file: Path,
    questions: Sequence[Question],
    budgets: Iterable[Budget] = (),
    progress: Callable[[int], None] | None = None,
) -> RetrievalEvalReport:
    """Run every answerable question through all retrievers and average section-level metrics."""
    from residency.index import manifest_hash  # numpy: loaded when an eval runs, not for --help

    answerable = [q for q in questions if q.relevant_ids]
    reports = _retriever_reports(index, answerable, progress)
    unknown = sorted({r for q in answerable for r in q.relevant_ids if not index.has_section(r)})
    hybrid = reports.get("hybrid")
    checked = tuple(
        b.model_copy(update={"actual": hybrid.overall.value(b.metric) if hybrid else None})
        for b in budgets
    )
    return RetrievalEvalReport(
        timestamp=dt.datetime.now(dt.UTC),
        index_dir=str(index.directory),
        manifest_hash=manifest_hash(index.directory),
        questions_file=str(questions_file),
        questions_hash=hashlib.sha256(questions_file.read_bytes()).hexdigest(),
        questions_total=len(questions),
        evaluated=len(answerable),
        excluded_no_relevant=len(questions) - len(answerable),
        unknown_relevant_ids=tuple(unknown[:20]),
        unknown_relevant_count=len(unknown),
        settings=_settings(index),
        retrievers=reports,
        budgets=checked,
    )


def _retriever_reports(
    index: Index, answerable: Sequence[Question], progress: Callable[[int], None] | None
) -> dict[str, RetrieverReport]:
    """Section-level metrics per retriever, overall and per question type (queries embedded in
    batches of QUERY_BATCH)."""
    rets = index.retrievers()
    rows: dict[str, list[tuple[str, dict[str, float]]]] = {}
    for start in range(0, len(answerable), QUERY_BATCH):
        batch = answerable[start : start + QUERY_BATCH]
        vectors = (
            rets.dense.embedder.embed_queries([q.query for q in batch]) if rets.dense else None
        )
        for i, q in enumerate(batch):
            vector = vectors[i] if vectors is not None else None
            for name, hits in index.search_all(q.query, MAX_K, vector).items():
                ranked = [h.section_id for h in hits]
                row = question_metrics(ranked, q.relevant_ids)
                rows.setdefault(name, []).append((q.type or UNTYPED, row))
        if progress is not None:
            progress(len(batch))
    reports: dict[str, RetrieverReport] = {}
    for name, scored in rows.items():
        types = sorted({t for t, _ in scored})
        reports[name] = RetrieverReport(
            overall=mean_metrics([r for _, r in scored]),
            by_type={t: mean_metrics([r for u, r in scored if u == t]) for t in types},
        )
    return reports


def _settings(index: Index) -> EvalSettings:
    """The retrieval settings the index was built and is searched with."""
    rets = index.retrievers()
    chunker = index.manifest.chunker
    return EvalSettings(
        embedder=index.manifest.embedder.name if index.manifest.embedder else None,
        sparse_tokenizer=index.manifest.sparse_tokenizer,
        weights=rets.hybrid.weights,
        prefetch=rets.hybrid.prefetch,
        rrf_k=rets.hybrid.rrf_k,
        chunker=f"{chunker.kind}/{chunker.chunk_chars}"
        + (f"/{chunker.chunk_overlap}" if chunker.kind == "fixed" else ""),
        backend=describe_backend(index),
    )


def describe_backend(index: Index) -> str:
    """'in-process', or the backend's name and what it opened (e.g. the Qdrant collection)."""
    backend = index.backend
    if backend is None:
        return "in-process"
    return f"{backend.name} {backend.describe()}"


def append_history(path: Path, report: RetrievalEvalReport) -> None:
    """Append the run as one JSON line (line-atomic; concurrent runs never interleave)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    append_line(path, orjson.dumps(report.model_dump(mode="json")))
