"""The small contract every retrieval backend meets: a ranked list of `Hit`s for a query."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class Hit:
    """A retrieved document: its id, the retriever's own score (higher is better), 1-based rank."""

    id: str
    score: float
    rank: int


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
