"""The router's second retrieval hop in the coverage evaluation (`residency.routing.second_hop`,
the router's own choice): the chunk one question gains, ranked once per pivot chunk."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

from residency.index import Index
from residency.retrieval import FusedHit
from residency.routing import second_hop


@dataclass(slots=True)
class SecondHop:
    """Second hops over one index; the rankings of pivot chunks and the sections of each
    resident set are computed once and shared by every row."""

    index: Index
    prefetch: int
    _rankings: dict[str, tuple[FusedHit, ...]] = field(default_factory=dict)
    _sections: dict[frozenset[str], frozenset[str]] = field(default_factory=dict)

    def chunk(
        self, prefix: frozenset[str], added: tuple[str, ...], pinned: Collection[str]
    ) -> str | None:
        """The chunk the second hop adds for a question routed to a prefix holding the chunks
        `prefix`, with `added` long-tail chunks (best first) and the chunks of `pinned` dated
        sections visible; None when nothing was added or every ranked section is shown."""
        if not added:
            return None
        pivot = added[0]
        hits = self._rankings.get(pivot)
        if hits is None:
            query = self.index.chunk(pivot).text
            hits = self._rankings[pivot] = tuple(self.index.search_chunks(query, self.prefetch))
        section_of = self.index.section_of
        shown = self._sections.get(prefix)
        if shown is None:
            shown = self._sections[prefix] = frozenset(section_of(c) for c in prefix)
        seen = shown.union(section_of(c) for c in (*added, *pinned))
        return second_hop(hits, seen, section_of)
