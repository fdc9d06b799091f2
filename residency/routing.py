"""The routing decision shared by the router and the coverage evaluation: does a question need
retrieved long-tail chunks beside the resident prefix, and which ones?

Retrieve over the whole corpus (resident chunks included: they compete on equal terms). When
the best-ranked chunk is resident and no long-tail chunk ranks within `margin` places of it, the
evidence is taken to be in the prefix: route "resident", nothing added. Otherwise route
"long_tail": add the top `k` chunks that are not resident. `margin=0` trusts the top hit alone;
a larger margin adds long-tail chunks more often (more recall, more prompt tokens).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

Route = Literal["resident", "long_tail"]


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
    long_tail_chunk_ids: tuple[str, ...]  # best first; empty for route "resident"
    top_chunk_id: str | None


def decide_route(
    hits: Sequence[ChunkHit],
    resident_chunk_ids: Collection[str],
    *,
    k: int = 5,
    margin: int = 1,
) -> RouteDecision:
    """Route one question from its fused chunk ranking (best first)."""
    if k < 0 or margin < 0:
        raise ValueError(f"k and margin must be >= 0, got k={k}, margin={margin}")
    if not hits:
        return RouteDecision("long_tail", (), None)
    top = hits[0].id
    long_tail = [h.id for h in hits if h.id not in resident_chunk_ids]
    if top in resident_chunk_ids:
        first_long_tail_rank = next(
            (i for i, h in enumerate(hits) if h.id not in resident_chunk_ids), None
        )
        if first_long_tail_rank is None or first_long_tail_rank > margin:
            return RouteDecision("resident", (), top)
    return RouteDecision("long_tail", tuple(long_tail[:k]), top)
