"""The coverage report's models: per-row metrics, settings, across-seed statistics and the
whole report (`residency eval coverage --json`)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from residency.eval.traffic import TrafficStats


class CoverageMetrics(BaseModel):
    """Coverage of a set of questions under one resident set."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    questions: int = Field(ge=0, description="Questions evaluated (with relevant ids).")
    coverage: float = Field(ge=0, le=1, description="Share whose gold evidence is visible.")
    coverage_all: float = Field(
        default=0.0,
        ge=0,
        le=1,
        description="Share whose every gold section is visible (a question that needs several "
        "is covered only when all are).",
    )
    resident_share: float = Field(ge=0, le=1, description="Share with gold in the prefix.")
    retrieved_share: float = Field(
        ge=0, le=1, description="Share with gold not in the prefix but among added chunks."
    )
    long_tail_questions: int = Field(ge=0, description="Questions whose gold is not resident.")
    long_tail_recall: float | None = Field(
        ge=0, le=1, description="Retrieved / long-tail questions (None when there are none)."
    )
    route_resident_share: float = Field(
        ge=0, le=1, description="Share routed 'resident' (nothing added)."
    )
    misrouted: int = Field(
        ge=0, description="Not covered although routed 'resident' (only the hedge was added)."
    )
    mean_added_chunks: float = Field(ge=0, description="Mean chunks added beyond the prefix.")
    mean_added_tokens: float = Field(
        ge=0, description="Mean prompt tokens beyond the cached prefix (added chunks)."
    )
    mean_prompt_tokens: float = Field(
        default=0.0,
        ge=0,
        description="Mean prompt tokens per question: the prefix it is routed to, the added "
        "chunks and the question (chat template not counted).",
    )
    mean_uncached_tokens: float = Field(
        default=0.0,
        ge=0,
        description="Mean prompt tokens vLLM must prefill per question: the added chunks and the "
        "question (the resident prefix counted as cached whole).",
    )


class StrategyResult(BaseModel):
    """One row of the comparison: a resident set and its coverage."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    name: str = Field(min_length=1, max_length=64, description="Row name, e.g. planner, rag-top3.")
    strategy: str = Field(min_length=1, max_length=32, description="Planning strategy.")
    k: int = Field(ge=0, description="Long-tail chunks added per long-tail route.")
    resident_sections: int = Field(ge=0, description="Sections wholly or partly resident.")
    resident_chunks: int = Field(ge=0, description="Chunks in the prefix.")
    prefix_tokens: int = Field(ge=0, description="Tokens of the cached prefix.")
    predicted_resident_share: float | None = Field(
        ge=0, le=1, description="The plan's own prediction (sum of p(s)); None for RAG-only."
    )
    overall: CoverageMetrics = Field(description="All evaluated questions.")
    by_type: dict[str, CoverageMetrics] = Field(description="Per question type.")
    rag_misses_rescued: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="Of the questions RAG top-5 misses, the share this row covers (None: no "
        "rag-top5 row, or it misses none).",
    )
    covered_mask: tuple[bool, ...] = Field(
        default=(), exclude=True, description="Covered, per evaluated question (not written)."
    )


class CoverageSettings(BaseModel):
    """The retrieval and routing every row was evaluated with."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    index_dir: str = Field(min_length=1, max_length=4096, description="Index evaluated.")
    manifest_hash: str = Field(min_length=64, max_length=64, description="sha256 of manifest.")
    embedder: str | None = Field(
        max_length=4096, description="Dense embedder; None: BM25-only retrieval."
    )
    sparse_tokenizer: str = Field(min_length=1, max_length=4096, description="BM25 tokenizer.")
    chunker: str = Field(min_length=1, max_length=4096, description="e.g. fixed/256/32.")
    prefetch: int = Field(ge=1, description="Chunks ranked per question before routing.")
    margin: int = Field(ge=0, description="Routing margin (decide_route).")
    hedge: int = Field(ge=0, description="Chunks the resident route still adds (decide_route).")
    spread: int = Field(
        default=0,
        ge=0,
        description="Top sections always shown (routing.top_section_chunks, plain RAG excepted; "
        "0 in reports written before it existed).",
    )
    hops: int = Field(
        default=1, ge=1, description="Retrieval hops (2: routing.second_hop, plain RAG excepted)."
    )
    tokenizer: str = Field(
        min_length=1, max_length=4096, description="Encoder the added tokens were counted with."
    )
    budget_tokens: int | None = Field(ge=1, description="Resident budget (simulation), if any.")
    today: dt.date | None = Field(
        default=None,
        description="Date time expressions resolved against (None: no dated section to pin).",
    )
    max_dated: int = Field(default=0, ge=0, description="Dated sections pinned per question.")


class SeedStat(BaseModel):
    """Mean and sample standard deviation of one metric over traffic seeds."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    mean: float = Field(description="Mean over seeds.")
    sd: float = Field(ge=0, description="Sample standard deviation (0 for one seed).")


class RowAcrossSeeds(BaseModel):
    """One strategy's metrics over `--seeds` simulated traffics."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    name: str = Field(min_length=1, max_length=64, description="Row name.")
    seeds: int = Field(ge=1, description="Traffic seeds run.")
    coverage: SeedStat = Field(description="Coverage (any gold section visible).")
    coverage_all: SeedStat = Field(description="Coverage (every gold section visible).")
    resident_share: SeedStat = Field(description="Gold in the prefix.")
    mean_added_tokens: SeedStat = Field(description="Prompt tokens beyond the cached prefix.")
    mean_prompt_tokens: SeedStat | None = Field(
        default=None, description="Prompt tokens per question (prefix, added chunks, question)."
    )
    mean_uncached_tokens: SeedStat | None = Field(
        default=None, description="Prompt tokens to prefill per question (added chunks, question)."
    )
    rag_misses_rescued: SeedStat | None = Field(
        default=None, description="Share of rag-top5's misses this row covers (None: no misses)."
    )


class CoverageReport(BaseModel):
    """A whole `residency eval coverage` run."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    kind: str = Field(default="coverage", max_length=32, description="Report kind.")
    timestamp: dt.datetime = Field(description="When the run finished (UTC).")
    questions_source: str = Field(
        min_length=1, max_length=4096, description="Questions file or simulation."
    )
    evaluated: int = Field(ge=0, description="Questions with relevant ids (in the metrics).")
    excluded_no_relevant: int = Field(ge=0, description="Questions with no relevant ids.")
    unknown_relevant_count: int = Field(ge=0, description="Relevant ids not in the index.")
    settings: CoverageSettings = Field(description="Retrieval and routing settings.")
    results: tuple[StrategyResult, ...] = Field(description="One row per resident set.")
    simulation: TrafficStats | None = Field(default=None, description="Simulated traffic, if any.")
    notes: tuple[str, ...] = Field(default=(), description="What the reader should know.")
    across_seeds: tuple[RowAcrossSeeds, ...] = Field(
        default=(), description="--seeds N: every row's mean and sd over N traffic seeds."
    )


def rescued_of_rag(
    rows: Sequence[StrategyResult], baseline: str = "rag-top5"
) -> tuple[StrategyResult, ...]:
    """Each row with the share of `baseline`'s misses it covers (same questions, same order)."""
    base = next((r for r in rows if r.name == baseline), None)
    if base is None:
        return tuple(rows)
    missed = [i for i, covered in enumerate(base.covered_mask) if not covered]
    if not missed:
        return tuple(rows)
    return tuple(
        r.model_copy(
            update={"rag_misses_rescued": sum(r.covered_mask[i] for i in missed) / len(missed)}
        )
        for r in rows
    )
