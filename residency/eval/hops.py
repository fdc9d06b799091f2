"""The second retrieval hop's pivot rankings in the coverage evaluation: the ranking of one
chunk's own text, computed once per pivot and shared by every row (the hop itself is
`residency.context.routing.second_hop`, inside `route_question`, the router's own choice)."""

from __future__ import annotations

from dataclasses import dataclass, field

from residency.index import Index
from residency.retrieval import FusedHit


@dataclass(slots=True)
class PivotRankings:
    """Rankings of pivot chunks' text over one index, cached per chunk (`route_question`'s
    `pivot_hits`)."""

    index: Index
    prefetch: int
    _rankings: dict[str, tuple[FusedHit, ...]] = field(default_factory=dict)

    def __call__(self, chunk_id: str) -> tuple[FusedHit, ...]:
        """The top-`prefetch` chunks for the text of `chunk_id`."""
        hits = self._rankings.get(chunk_id)
        if hits is None:
            query = self.index.chunk(chunk_id).text
            hits = self._rankings[chunk_id] = tuple(self.index.search_chunks(query, self.prefetch))
        return hits
