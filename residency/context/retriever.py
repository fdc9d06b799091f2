"""The chunk-level retriever a pipeline searches with, chosen by name from an index's
retrievers (`chunk_retriever`): the router, the canary and the re-planner rank with the same one."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from residency.context.routing import ChunkHit
from residency.context.settings import RetrieverName
from residency.errors import ConfigError
from residency.index import Index


class ChunkSearch(Protocol):
    """A chunk-level retriever (BM25, dense or the fused hybrid)."""

    def search(self, query: str, k: int) -> Sequence[ChunkHit]:
        """Top-k chunk hits, best first."""
        ...


def chunk_retriever(index: Index, name: RetrieverName) -> ChunkSearch:
    """The retriever called `name` over `index` (qdrant: the index's backend fused)."""
    retrievers = index.retrievers()
    if name == "bm25":
        return retrievers.bm25
    if name == "dense":
        if retrievers.dense is None:
            raise ConfigError(
                f"--retriever dense: index {index.directory} was built without dense vectors "
                "(--no-dense); use --retriever bm25 or rebuild the index"
            )
        return retrievers.dense
    return retrievers.hybrid
