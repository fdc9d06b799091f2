"""The routing decision shared by the router and the coverage evaluation: which resident prefix
a question goes out with, and which retrieved chunks follow it (`route_question`, the one function
both call, so the evaluation measures what is served).

Retrieve over the whole corpus (resident chunks included: they compete on equal terms). When
the best-ranked chunk is resident and no long-tail chunk ranks within `margin` places of it, the
evidence is taken to be in the prefix: route "resident", and only the best `hedge` non-resident
chunk(s) are added as a cheap insurance against a resident near-duplicate outranking the real
evidence. Otherwise route "long_tail": add the top `k` chunks that are not resident. `margin=0`
trusts the top hit alone; a larger margin adds long-tail chunks more often (more recall, more
prompt tokens).

Then the **top sections** (`spread`, default `k`): each of the `spread` best-ranked sections of
the whole-corpus ranking that the prompt does not show yet (not in the routed prefix, not added,
not pinned) gets its best-ranked chunk added. A question that needs two sections often finds the
second one 2nd-5th, in a branch it was not routed to: with several prefixes the resident route
used to add one hedge chunk there, and one prefix (whose route is mostly "long_tail") showed more
of them. Now every section rag-top`k` would show is visible, wherever it lives (docs/coverage.md:
measured against the other directions tried).

Defaults measured on JSQuAD with Zipf traffic (`residency eval coverage --squad`, 5 seeds):
margin 1 + hedge 1 gave coverage 0.989 at 611 added tokens per question, against 0.986 / 545
without the hedge and 0.988 / 741 with margin 2; RAG-only top-5 adds 870.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

Route = Literal["resident", "long_tail"]
DEFAULT_K = 5
DEFAULT_MARGIN = 1
DEFAULT_HEDGE = 1
# Dated sections pinned whole for a question's time expression (router and coverage eval).
DEFAULT_MAX_DATED = 5
# Retrieval hops: 2 adds one chunk found by searching with the best added chunk's own text
# (opt-in: more sections visible, but SmolLM2's answers got worse with it; docs/plan.md).
DEFAULT_HOPS = 1
# Chunks ranked per question before routing (DESIGN.md §7: 20 -> 40 raised recall@10, 80 gave
# nothing more).
DEFAULT_PREFETCH = 40
# The best-ranked sections always shown (added where the routed prefix lacks them): k, so that
# every section rag-top-k shows is visible (docs/coverage.md#questions-that-need-several-sections).
DEFAULT_SPREAD = DEFAULT_K


class RoutingSettings(BaseModel):
    """How a question is routed: one model for the router (`residency serve`) and the coverage
    evaluation (`residency eval coverage`), so the evaluation measures what is served."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    k: int = Field(
        default=DEFAULT_K,
        ge=0,
        le=100,
        description="Long-tail chunks added when the evidence is not resident.",
    )
    margin: int = Field(
        default=DEFAULT_MARGIN,
        ge=0,
        le=100,
        description="A long-tail chunk within this many ranks of a resident top hit is added.",
    )
    hedge: int = Field(
        default=DEFAULT_HEDGE,
        ge=0,
        le=100,
        description="Long-tail chunks added even on the resident route.",
    )
    spread: int = Field(
        default=DEFAULT_SPREAD,
        ge=0,
        le=100,
        description="Best-ranked sections always shown: each of this many top sections of the "
        "whole-corpus ranking that the routed prefix does not hold gets its best chunk added "
        "(wherever it lives); 0: the routed prefix and the route's own chunks only.",
    )
    hops: int = Field(
        default=DEFAULT_HOPS,
        ge=1,
        le=2,
        description="Retrieval hops. 2: also search with the best added chunk's text and add "
        "the best chunk of a section not shown yet (questions that need two sections); 1: the "
        "question's own ranking only.",
    )
    prefetch: int = Field(
        default=DEFAULT_PREFETCH,
        ge=1,
        le=1000,
        description="Chunks ranked per question before routing.",
    )
    today: dt.date | None = Field(
        default=None,
        description="Date a question's time expression resolves against (YYYY-MM-DD; default: "
        "today): its dated sections are pinned whole.",
    )
    max_dated: int = Field(
        default=DEFAULT_MAX_DATED,
        ge=0,
        le=50,
        description="Dated sections pinned for a time expression (0: none).",
    )

    @field_validator("today", mode="before")
    @classmethod
    def _iso_date(cls, value: object) -> object:
        if isinstance(value, str):
            try:
                return dt.date.fromisoformat(value)
            except ValueError:
                raise ValueError(f"{value!r}: expected YYYY-MM-DD, e.g. 2026-01-15") from None
        return value

    @model_validator(mode="after")
    def _prefetch_covers_k(self) -> Self:
        if self.prefetch < max(self.k, self.spread):
            raise ValueError(
                f"--prefetch {self.prefetch} is below --k {self.k} or --spread {self.spread}: "
                "rank at least that many chunks"
            )
        return self


class ChunkHit(Protocol):
    """A ranked chunk hit (e.g. `FusedHit`)."""

    @property
    def id(self) -> str:
        """Chunk id."""
        ...


@dataclass(frozen=True, slots=True)
class RouteDecision:
    """What the router adds for one question."""

    route: Route
    long_tail_chunk_ids: tuple[str, ...]  # best first; at most `hedge` for route "resident"
    top_chunk_id: str | None


def decide_route(
    hits: Sequence[ChunkHit],
    resident_chunk_ids: Collection[str],
    *,
    k: int = DEFAULT_K,
    margin: int = DEFAULT_MARGIN,
    hedge: int = DEFAULT_HEDGE,
) -> RouteDecision:
    """Route one question from its fused chunk ranking (best first)."""
    if k < 0 or margin < 0 or hedge < 0:
        raise ValueError(f"k, margin and hedge must be >= 0, got {k}, {margin}, {hedge}")
    if not hits:
        return RouteDecision("long_tail", (), None)
    top = hits[0].id
    long_tail = [h.id for h in hits if h.id not in resident_chunk_ids]
    if top in resident_chunk_ids:
        first_long_tail_rank = next(
            (i for i, h in enumerate(hits) if h.id not in resident_chunk_ids), None
        )
        if first_long_tail_rank is None or first_long_tail_rank > margin:
            return RouteDecision("resident", tuple(long_tail[: min(hedge, k)]), top)
    return RouteDecision("long_tail", tuple(long_tail[:k]), top)


def routing_map(prefix_chunks: Mapping[str, Collection[str]]) -> dict[str, str]:
    """Chunk id -> the one prefix that holds it. A chunk of the shared head is in every prefix
    and says nothing about where a question belongs: it routes nowhere (with one prefix, every
    chunk routes to it)."""
    holders: dict[str, list[str]] = {}
    for prefix, chunks in prefix_chunks.items():
        for chunk in chunks:
            holders.setdefault(chunk, []).append(prefix)
    return {c: ps[0] for c, ps in holders.items() if len(ps) == 1}


def choose_prefix(
    hits: Sequence[ChunkHit], prefix_of_chunk: Mapping[str, str], default: str
) -> str:
    """The prefix that holds the best-ranked routed chunk of the fused ranking (`routing_map`:
    shared-head chunks are skipped); `default` (the busiest prefix) when no hit is in any one
    prefix. With one prefix it is always that."""
    for hit in hits:
        prefix = prefix_of_chunk.get(hit.id)
        if prefix is not None:
            return prefix
    return default


def second_hop(
    pivot_hits: Sequence[ChunkHit], seen_sections: Collection[str], section_of: Callable[[str], str]
) -> str | None:
    """The second retrieval hop: the best-ranked chunk of a section the prompt does not show yet.

    `pivot_hits` is the ranking of the first added chunk's own text (the best retrieved evidence
    outside the prefix); `seen_sections` holds every section already visible (the routed prefix's,
    the added chunks', the pinned dated ones). A question that needs two sections ("how is X
    related to Y?") usually retrieves X's section first, and X's text names Y: searching with it
    reaches Y's section where the question's own words rank it 9th-23rd. The router and the
    coverage evaluation both call it, so they add the same chunk."""
    for hit in pivot_hits:
        if section_of(hit.id) not in seen_sections:
            return hit.id
    return None


def top_section_chunks(
    hits: Sequence[ChunkHit],
    shown_sections: Collection[str],
    section_of: Callable[[str], str],
    spread: int,
) -> tuple[str, ...]:
    """The best-ranked chunk of each of the `spread` best-ranked sections of `hits` that
    `shown_sections` does not hold, best first. A section's rank is its best chunk's."""
    out: list[str] = []
    ranked: set[str] = set()
    for hit in hits:
        if len(ranked) >= spread:
            break
        section = section_of(hit.id)
        if section in ranked:
            continue
        ranked.add(section)
        if section not in shown_sections:
            out.append(hit.id)
    return tuple(out)


@dataclass(frozen=True, slots=True)
class PrefixRoutes:
    """A plan's prefixes as the router routes between them (one entry with one prefix, an empty
    one for plain RAG): each prefix's chunks and sections, and the prefix each routed chunk
    selects."""

    chunks: Mapping[str, frozenset[str]]  # prefix id -> its chunk ids (the busiest first)
    sections: Mapping[str, frozenset[str]]  # prefix id -> sections with a chunk in it
    prefix_of: Mapping[str, str]  # `routing_map`
    default: str  # the busiest prefix

    @classmethod
    def build(
        cls, prefixes: Iterable[tuple[str, frozenset[str]]], section_of: Callable[[str], str]
    ) -> PrefixRoutes:
        """From (prefix id, chunk ids) pairs, busiest first (plain RAG: one empty prefix)."""
        chunks = dict(prefixes)
        if not chunks:
            raise ValueError("PrefixRoutes needs at least one prefix (plain RAG: an empty one)")
        sections = {p: frozenset(section_of(c) for c in cs) for p, cs in chunks.items()}
        return cls(chunks, sections, routing_map(chunks), next(iter(chunks)))


@dataclass(frozen=True, slots=True)
class RoutedQuestion:
    """What one question is sent with: the prefix, and what follows it."""

    prefix_id: str
    route: Route
    top_chunk_id: str | None
    chunk_ids: tuple[str, ...]  # chunks added after the prefix, prompt order
    dated_section_ids: tuple[str, ...]  # sections pinned whole for a time expression, first


def route_question(
    hits: Sequence[ChunkHit],
    routes: PrefixRoutes,
    settings: RoutingSettings,
    section_of: Callable[[str], str],
    *,
    pin_dated: Callable[[frozenset[str]], tuple[str, ...]] | None = None,
    pivot_hits: Callable[[str], Sequence[ChunkHit]] | None = None,
) -> RoutedQuestion:
    """Route one question from its whole-corpus ranking (best first): the prefix holding its
    best-ranked routed chunk (`choose_prefix`), the route's long-tail chunks (`decide_route`),
    the sections `pin_dated` pins for the chosen prefix's chunks (their chunks are not added
    again), the chunks of the top `spread` sections not shown yet (`top_section_chunks`), then,
    with `hops` 2, the second hop from the first added chunk (`pivot_hits` ranks a chunk's text;
    `second_hop`). `residency serve` and `residency eval coverage` both call it."""
    prefix = choose_prefix(hits, routes.prefix_of, routes.default)
    resident = routes.chunks[prefix]
    s = settings
    decision = decide_route(hits, resident, k=s.k, margin=s.margin, hedge=s.hedge)
    dated = pin_dated(resident) if pin_dated is not None else ()
    added = [c for c in decision.long_tail_chunk_ids if section_of(c) not in dated]
    shown = set(routes.sections[prefix]).union(dated, (section_of(c) for c in added))
    for chunk in top_section_chunks(hits, shown, section_of, s.spread):
        added.append(chunk)
        shown.add(section_of(chunk))
    if s.hops > 1 and added and pivot_hits is not None:
        extra = second_hop(pivot_hits(added[0]), shown, section_of)
        if extra is not None:
            added.append(extra)
    return RoutedQuestion(prefix, decision.route, decision.top_chunk_id, tuple(added), dated)
