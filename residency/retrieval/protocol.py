"""The small contract every retrieval backend meets: a ranked list of `Hit`s for a query."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from residency.retrieval.embedders import Embedder


@dataclass(frozen=True, slots=True)
class Hit:
    """A retrieved document: its id, the retriever's own score (higher is better), 1-based rank."""

    id: str
    score: float
    rank: int


@dataclass(frozen=True, slots=True)
class FusedHit:
    """A fused result: RRF score and rank, plus each retriever's own rank and score for it."""

    id: str
    score: float
    rank: int
    ranks: dict[str, int]
    scores: dict[str, float]


class Retriever(Protocol):
    """Anything that turns a query into its top-k hits, best first."""

    name: str

    def search(self, query: str, k: int) -> list[Hit]:
        """The top ``k`` hits for ``query``, best first (ranks 1..n, n <= k)."""
        ...


def check_k(k: int) -> None:
    """Raise ValueError unless ``k`` is a positive int (a bool or 0 is a caller's bug)."""
    if isinstance(k, bool) or not isinstance(k, int) or k <= 0:
        raise ValueError(f"k must be a positive int, got {k!r}")


class DenseSearch(Retriever, Protocol):
    """A dense retriever whose query embedding can be done ahead (a batch of questions)."""

    @property
    def embedder(self) -> Embedder:
        """The query-side embedder."""
        ...

    def search_vector(self, vector: NDArray[Any], k: int) -> list[Hit]:
        """The top ``k`` for one precomputed query vector."""
        ...


class FusedSearch(Protocol):
    """Several retrievers fused (in process: `HybridRetriever`; Qdrant: `QdrantHybrid`)."""

    name: str
    weights: dict[str, float]
    prefetch: int
    rrf_k: int

    def search(
        self, query: str, k: int, query_vector: NDArray[Any] | None = None
    ) -> list[FusedHit]:
        """The fused top ``k``."""
        ...

    def search_all(
        self, query: str, k: int, query_vector: NDArray[Any] | None = None
    ) -> dict[str, list[Hit] | list[FusedHit]]:
        """Each retriever's top ``k`` and the fused top ``k`` ("hybrid") from one pass."""
        ...
