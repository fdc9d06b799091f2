"""The routing decision shared by the router and the coverage evaluation: does a question need
retrieved long-tail chunks beside the resident prefix, and which ones?

Retrieve over the whole corpus (resident chunks included: they compete on equal terms). When
the best-ranked chunk is resident and no long-tail chunk ranks within `margin` places of it, the
evidence is taken to be in the prefix: route "resident", and only the best `hedge` non-resident
chunk(s) are added as a cheap insurance against a resident near-duplicate outranking the real
evidence. Otherwise route "long_tail": add the top `k` chunks that are not resident. `margin=0`
trusts the top hit alone; a larger margin adds long-tail chunks more often (more recall, more
prompt tokens).

Defaults measured on JSQuAD with Zipf traffic (`residency eval coverage --squad`, 5 seeds):
margin 1 + hedge 1 gave coverage 0.989 at 611 added tokens per question, against 0.986 / 545
without the hedge and 0.988 / 741 with margin 2; RAG-only top-5 adds 870.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Collection, Mapping, Sequence
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
        if self.prefetch < self.k:
            raise ValueError(
                f"--prefetch {self.prefetch} is below --k {self.k}: rank at least k chunks"
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
