"""Query vectors for many logged questions at once, through the on-disk query-vector cache: a
re-plan from an unchanged query log embeds nothing, a grown one only its new questions."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from numpy.typing import NDArray

from residency.index.store import Index
from residency.paths import cache_root
from residency.retrieval.query_cache import CACHE_FILE, QueryVectorCache, embed_queries_cached


def default_query_cache() -> QueryVectorCache:
    """The cache under ``$RESIDENCY_CACHE`` (else the user's cache directory)."""
    return QueryVectorCache(cache_root() / CACHE_FILE)


def log_query_vectors(
    index: Index, queries: Iterable[str], cache: QueryVectorCache | None = None
) -> dict[str, NDArray[Any]]:
    """query -> its vector by the index's own embedder, one batch for the uncached ones
    (empty when the index has no dense part: searches then embed nothing either)."""
    distinct = list(dict.fromkeys(queries))
    dense = index.retrievers().dense
    if dense is None or not distinct:
        return {}
    vectors, _ = embed_queries_cached(dense.embedder, distinct, cache or default_query_cache())
    return dict(zip(distinct, vectors, strict=True))
