"""Coverage evaluation: how often the generator sees a question's gold evidence
(docs/design/evaluation.md).

For one resident set (a plan's resident chunks, or nothing for RAG-only) and a question:

- The question's chunks are ranked once over the whole corpus (`Index.search_chunks(query,
  prefetch)`, resident chunks included) and routed by `context.routing.route_question`, the
  router's own function, with the same `RoutingSettings`: the prefix (several: the one holding
  the best-ranked routed chunk), route "resident" adds the best `hedge` non-resident chunk(s)
  (insurance), route "long_tail" adds the top `k` non-resident chunks, and the best chunk of
  each of the top `spread` sections not shown yet follows. RAG-only top-k (the empty resident
  set) adds the top k chunks and nothing else: no top sections, no dated route, one hop.
- **Visible** chunks = resident chunks ∪ added chunks. A gold section is **visible** when at
  least one of its chunks is visible: a wholly resident section always is, and so is a section
  only partly resident (a part split at chunk boundaries) or one of whose chunks was retrieved.
  Gold is section-level (qa.jsonl names paragraphs, not answer offsets), so "one chunk of it"
  is the finest test available; for JSQuAD most paragraphs are one chunk.
- A question is **covered** when any of its gold sections is visible (SQuAD has one). Questions
  without relevant ids (type "unknown") are excluded and counted; a relevant id that is not a
  section of the index is never visible.
- **In prefix**: a gold section has a resident chunk. **Retrieved**: not in prefix, but a gold
  chunk was added. coverage = in-prefix share + retrieved share; long-tail recall = retrieved /
  questions not in prefix; misrouted = not covered although routed "resident" (a miss the
  long-tail route might have caught).
- **Dated route** (as `residency serve` pins them): when a question has a time expression
  (`timex.resolve_period`, against `--today`), up to `max_dated` sections dated inside it
  (the router's own `residency.context.builder.pinned_dated`: retrieved ones first) are visible
  whole, unless wholly in the routed prefix; a long-tail chunk of a pinned section is not added
  again. Plain RAG rows pin nothing.
- **Second hop** (`hops` 2): `context.routing.second_hop`'s chunk last; plain RAG: one hop.
- **Uncached tokens**: the added chunks, the pinned sections and the question (the prefix it is
  routed to is cached); **prompt tokens** add that prefix.
- **Added tokens** (prompt tokens beyond the cached prefix): the sum over added chunks of
  count(render_chunk(chunk)) + 1 (the blank-line separator), counted with the plan's encoder, the
  same way the planner prices a section (the question, the same for every strategy, is not).

Rankings do not depend on the resident set, so `evaluate_coverage` ranks each distinct query
once and scores every resident set on the same rankings.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace

from residency.context.routing import (
    PrefixRoutes,
    Route,
    RoutedQuestion,
    RoutingSettings,
    route_question,
)
from residency.corpus.model import Chunk, Section
from residency.eval.coverage_report import (
    CoverageMetrics,
    CoverageReport,
    CoverageSettings,
    RowAcrossSeeds,
    SeedStat,
    StrategyResult,
    rescued_of_rag,
)
from residency.eval.dated import DatedPinning, dated_pinning
from residency.eval.defaults import DEFAULT_PREFETCH
from residency.eval.hops import PivotRankings
from residency.eval.questions import UNTYPED, Question
from residency.eval.traffic import TrafficStats
from residency.index import Index, manifest_hash
from residency.planning.plan_model import ResidencyPlan
from residency.planning.prefix import render_passage
from residency.retrieval import FusedHit
from residency.tokenizer import ModelTokenizer

__all__ = [
    "DEFAULT_PREFETCH",
    "RAG_BASELINE_KS",
    "CoverageMetrics",
    "CoverageReport",
    "CoverageSettings",
    "Outcome",
    "ResidentSet",
    "RowAcrossSeeds",
    "SeedStat",
    "StrategyResult",
    "chunk_token_counts",
    "evaluate_coverage",
    "evaluate_resident_set",
    "question_outcome",
    "rank_queries",
    "render_chunk",
    "rescued_of_rag",
    "summarize",
]

RAG_BASELINE_KS = (3, 5)


@dataclass(frozen=True, slots=True)
class ResidentSet:
    """What one strategy keeps in the prefix, and how many chunks its long-tail route adds."""

    name: str  # row name: 'planner', 'rag-top3', ...
    strategy: str
    chunk_ids: frozenset[str]
    sections: int
    prefix_tokens: int
    k: int
    predicted_share: float | None = None  # the plan's own sum of p(s), if it is a plan
    # Several prefixes: each question sees only the one it is routed to (busiest first).
    prefix_chunks: tuple[tuple[str, frozenset[str]], ...] = ()
    prefix_token_counts: tuple[int, ...] = ()  # tokens of each of `prefix_chunks`' prefixes

    @classmethod
    def from_plan(cls, plan: ResidencyPlan, k: int, name: str | None = None) -> ResidentSet:
        """A plan's resident chunks (a 'rag' plan holds none: RAG-only top-k); a plan of several
        prefixes is evaluated as served: one prefix per question."""
        chunk_ids = plan.resident_chunk_ids()
        prefixes = plan.all_prefixes()
        per_prefix = tuple(
            (p.id, frozenset(c for item in p.resident for c in item.chunk_ids)) for p in prefixes
        )
        default = f"rag-top{k}" if plan.strategy == "rag" else plan.strategy
        return cls(
            name=name or ("residency" if len(prefixes) > 1 else default),
            prefix_chunks=per_prefix if len(prefixes) > 1 else (),
            prefix_token_counts=tuple(p.tokens for p in prefixes) if len(prefixes) > 1 else (),
            strategy=plan.strategy,
            chunk_ids=chunk_ids,
            sections=plan.coverage.resident_sections,
            prefix_tokens=plan.prefix.token_count,
            k=k,
            predicted_share=plan.coverage.resident_share if chunk_ids else None,
        )

    def routes(self, section_of: Callable[[str], str]) -> PrefixRoutes:
        """The prefixes a question is routed between (one, or the empty one of plain RAG)."""
        return PrefixRoutes.build(self.prefix_chunks or (("p0", self.chunk_ids),), section_of)

    def routing(self, settings: RoutingSettings) -> RoutingSettings:
        """The router's `settings` at this row's k; plain RAG adds its top k and nothing else."""
        if self.strategy == "rag":
            return settings.model_copy(update={"k": self.k, "spread": 0, "hops": 1})
        return settings.model_copy(update={"k": self.k})


@dataclass(frozen=True, slots=True)
class Outcome:
    """One question under one resident set."""

    route: Route
    in_prefix: bool
    retrieved: bool  # not in prefix, and a gold chunk was added
    added_chunks: int
    added_tokens: int
    all_visible: bool = False  # every gold section visible (questions that need several)
    prompt_tokens: int = 0  # the routed prefix + added chunks + the question
    uncached_tokens: int = 0  # added chunks + the question (the prefix is cached)

    @property
    def covered(self) -> bool:
        """Gold evidence visible to the generator."""
        return self.in_prefix or self.retrieved


def render_chunk(section: Section, chunk: Chunk) -> str:
    """A retrieved chunk as the router renders it: section header and source, chunk text."""
    return render_passage(section, chunk.text, chunk.start_char)


def chunk_token_counts(index: Index, encoder: ModelTokenizer) -> dict[str, int]:
    """Prompt tokens each chunk adds when retrieved (rendered, plus 1 for the separator)."""
    return {
        c.id: encoder.count(render_chunk(index.section(c.section_id), c)) + 1 for c in index.chunks
    }


def question_outcome(
    routed: RoutedQuestion,
    resident: Collection[str],
    gold_sections: Sequence[Collection[str]],
    tokens: Mapping[str, int],
    *,
    pinned: Collection[str] = (),
    pinned_tokens: int = 0,
) -> Outcome:
    """Whether one routed question's gold evidence is visible, and at what cost (`resident`:
    the chunks of the prefix it went out with; `gold_sections`: the chunks of each gold
    section; `pinned`: the chunks of the dated sections pinned whole, costing `pinned_tokens`)."""
    added = routed.chunk_ids
    visible = {*added, *pinned}
    gold = {c for chunks in gold_sections for c in chunks}
    in_prefix = any(c in resident for c in gold)
    retrieved = not in_prefix and any(c in gold for c in visible)
    all_visible = bool(gold_sections) and all(
        any(c in resident or c in visible for c in chunks) for chunks in gold_sections
    )
    cost = sum(tokens[c] for c in added) + pinned_tokens
    n_pinned = len(routed.dated_section_ids)
    return Outcome(routed.route, in_prefix, retrieved, len(added) + n_pinned, cost, all_visible)


def summarize(outcomes: Sequence[Outcome]) -> CoverageMetrics:
    """Aggregate per-question outcomes (zeros for an empty set)."""
    n = len(outcomes)
    in_prefix = sum(o.in_prefix for o in outcomes)
    retrieved = sum(o.retrieved for o in outcomes)
    long_tail = n - in_prefix
    share = (lambda x: x / n) if n else (lambda x: 0.0)
    return CoverageMetrics(
        questions=n,
        coverage=share(in_prefix + retrieved),
        coverage_all=share(sum(o.all_visible for o in outcomes)),
        resident_share=share(in_prefix),
        retrieved_share=share(retrieved),
        long_tail_questions=long_tail,
        long_tail_recall=retrieved / long_tail if long_tail else None,
        route_resident_share=share(sum(o.route == "resident" for o in outcomes)),
        misrouted=sum(1 for o in outcomes if not o.covered and o.route == "resident"),
        mean_added_chunks=share(sum(o.added_chunks for o in outcomes)),
        mean_added_tokens=share(sum(o.added_tokens for o in outcomes)),
        mean_prompt_tokens=share(sum(o.prompt_tokens for o in outcomes)),
        mean_uncached_tokens=share(sum(o.uncached_tokens for o in outcomes)),
    )


def rank_queries(
    index: Index,
    queries: Sequence[str],
    prefetch: int,
    progress: Callable[[int], None] | None = None,
) -> dict[str, tuple[FusedHit, ...]]:
    """The fused top-`prefetch` chunks of each distinct query."""
    out: dict[str, tuple[FusedHit, ...]] = {}
    for query in dict.fromkeys(queries):
        out[query] = tuple(index.search_chunks(query, prefetch))
        if progress is not None:
            progress(1)
    return out


def evaluate_resident_set(
    index: Index,
    questions: Sequence[Question],
    rankings: Mapping[str, Sequence[FusedHit]],
    resident: ResidentSet,
    tokens: Mapping[str, int],
    routing: RoutingSettings | None = None,
    question_tokens: Mapping[str, int] | None = None,
    dated: DatedPinning | None = None,
    pivots: PivotRankings | None = None,
) -> StrategyResult:
    """Coverage of answerable `questions` (already ranked) under one resident set, each routed by
    `route_question` with `routing` (default: the router's) at the row's k, and what each prompt
    costs (`question_tokens`: each query's tokens; none: the question counts 0; `dated`: the
    router's dated route, `pivots`: the second hop's rankings; plain RAG uses neither)."""
    settings = resident.routing(routing or RoutingSettings())
    if resident.strategy == "rag":
        dated = None
    routes = resident.routes(index.section_of)
    size_of = dict(zip(routes.chunks, resident.prefix_token_counts, strict=False))
    by_type: dict[str, list[Outcome]] = {}
    outcomes: list[Outcome] = []
    for q in questions:
        if not q.relevant_ids:
            continue
        gold_sections = _gold_sections(index, q.relevant_ids)
        hits = rankings[q.query]

        def pin(prefix: frozenset[str], query: str = q.query) -> tuple[str, ...]:
            assert dated is not None
            return dated.sections(query, rankings[query], prefix)

        routed = route_question(
            hits,
            routes,
            settings,
            index.section_of,
            pin_dated=pin if dated is not None else None,
            pivot_hits=pivots,
        )
        pinned = {c.id for sid in routed.dated_section_ids for c in index.chunks_of(sid)}
        outcome = question_outcome(
            routed,
            routes.chunks[routed.prefix_id],
            gold_sections,
            tokens,
            pinned=pinned,
            pinned_tokens=dated.tokens(routed.dated_section_ids) if dated is not None else 0,
        )
        own = (question_tokens or {}).get(q.query, 0)
        prefix_tokens = size_of.get(routed.prefix_id, resident.prefix_tokens)
        outcome = replace(
            outcome,
            prompt_tokens=prefix_tokens + outcome.added_tokens + own,
            uncached_tokens=outcome.added_tokens + own,
        )
        outcomes.append(outcome)
        by_type.setdefault(q.type or UNTYPED, []).append(outcome)
    return _result(resident, outcomes, by_type)


def _gold_sections(index: Index, relevant_ids: Sequence[str]) -> list[frozenset[str]]:
    """The chunks of each gold section (an unknown gold id: one empty set, never visible)."""
    gold_sections = [
        frozenset(c.id for c in index.chunks_of(sid))
        for sid in relevant_ids
        if index.has_section(sid)
    ]
    if len(gold_sections) < len(relevant_ids):
        gold_sections.append(frozenset())
    return gold_sections


def _result(
    resident: ResidentSet, outcomes: Sequence[Outcome], by_type: Mapping[str, Sequence[Outcome]]
) -> StrategyResult:
    """One row of the comparison: the resident set and its outcomes, overall and per type."""
    return StrategyResult(
        name=resident.name,
        strategy=resident.strategy,
        k=resident.k,
        resident_sections=resident.sections,
        resident_chunks=len(resident.chunk_ids),
        prefix_tokens=resident.prefix_tokens,
        predicted_resident_share=resident.predicted_share,
        overall=summarize(outcomes),
        by_type={t: summarize(o) for t, o in sorted(by_type.items())},
        covered_mask=tuple(o.covered for o in outcomes),
    )


def evaluate_coverage(
    index: Index,
    questions: Sequence[Question],
    resident_sets: Sequence[ResidentSet],
    encoder: ModelTokenizer,
    *,
    source: str,
    routing: RoutingSettings | None = None,
    budget_tokens: int | None = None,
    simulation: TrafficStats | None = None,
    notes: Sequence[str] = (),
    progress: Callable[[int], None] | None = None,
) -> CoverageReport:
    """Rank every distinct answerable query once, then score each resident set on it, routed as
    `residency serve` routes with `routing` (default: the router's defaults; its dated route
    resolves time expressions against `routing.today`, default the date today)."""
    s = routing or RoutingSettings()
    answerable = [q for q in questions if q.relevant_ids]
    rankings = rank_queries(index, [q.query for q in answerable], s.prefetch, progress)
    tokens = chunk_token_counts(index, encoder)
    asked = {q.query: encoder.count(q.query) for q in answerable}
    dated = dated_pinning(index, encoder, s.today, s.max_dated)
    pivots = PivotRankings(index, s.prefetch) if s.hops > 1 else None
    results = rescued_of_rag(
        [
            evaluate_resident_set(index, answerable, rankings, r, tokens, s, asked, dated, pivots)
            for r in resident_sets
        ]
    )
    unknown = {sid for q in answerable for sid in q.relevant_ids if not index.has_section(sid)}
    m = index.manifest
    chunker = m.chunker
    return CoverageReport(
        timestamp=dt.datetime.now(dt.UTC),
        questions_source=source,
        evaluated=len(answerable),
        excluded_no_relevant=len(questions) - len(answerable),
        unknown_relevant_count=len(unknown),
        settings=CoverageSettings(
            index_dir=str(index.directory),
            manifest_hash=manifest_hash(index.directory),
            embedder=m.embedder.name if m.embedder else None,
            sparse_tokenizer=m.sparse_tokenizer,
            chunker=f"{chunker.kind}/{chunker.chunk_chars}/{chunker.chunk_overlap}",
            prefetch=s.prefetch,
            margin=s.margin,
            hedge=s.hedge,
            spread=s.spread,
            hops=s.hops,
            tokenizer=encoder.name,
            budget_tokens=budget_tokens,
            today=dated.today if dated else None,
            max_dated=dated.max_dated if dated else 0,
        ),
        results=results,
        simulation=simulation,
        notes=tuple(notes),
    )
