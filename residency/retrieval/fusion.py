"""Weighted reciprocal rank fusion of ranked lists: a pure function, no I/O.

RRF (Cormack, Clarke & Büttcher, SIGIR 2009): ``score(d) = sum_r w_r / (k + rank_r(d))`` over the
retrievers r that returned d, with k = 60 from the paper. Worked example, k = 60, weights
dense 0.3 / bm25 0.7: a passage ranked 1st by bm25 and 3rd by dense scores
0.7 / 61 + 0.3 / 63 = 0.016237; one ranked 1st by dense only scores 0.3 / 61 = 0.004918.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from residency.retrieval.protocol import FusedHit, Hit, check_k

__all__ = ["RRF_K", "FusedHit", "fuse_rrf"]

RRF_K = 60


def fuse_rrf(
    ranked: Mapping[str, Sequence[Hit]],
    weights: Mapping[str, float] | None = None,
    k: int = RRF_K,
    limit: int | None = None,
) -> list[FusedHit]:
    """Weighted RRF of ``ranked`` (retriever name -> hits); ties by best single rank, then id.

    ``weights`` default to 1 for every retriever; names in ``weights`` but not in ``ranked`` are
    ignored, a retriever in ``ranked`` without a weight is a ValueError. A retriever that lists an
    id twice counts its better rank.
    """
    if k < 0:
        raise ValueError(f"RRF k must be >= 0, got {k}")
    if limit is not None:
        check_k(limit)
    if weights is None:
        weights = dict.fromkeys(ranked, 1.0)
    missing = sorted(set(ranked) - set(weights))
    if missing:
        raise ValueError(f"no fusion weight for retriever(s) {missing}; weights: {dict(weights)}")
    negative = {n: w for n, w in weights.items() if n in ranked and not w >= 0}
    if negative:
        raise ValueError(f"fusion weights must be >= 0, got {negative}")

    ranks: dict[str, dict[str, int]] = {}
    scores: dict[str, dict[str, float]] = {}
    for name, hits in ranked.items():
        for hit in hits:
            doc_ranks = ranks.setdefault(hit.id, {})
            if name not in doc_ranks or hit.rank < doc_ranks[name]:
                doc_ranks[name] = hit.rank
                scores.setdefault(hit.id, {})[name] = hit.score

    # fsum is exactly rounded, so equal sets of terms tie exactly whatever the retriever order.
    fused = {
        doc: math.fsum(weights[name] / (k + rank) for name, rank in doc_ranks.items())
        for doc, doc_ranks in ranks.items()
    }
    order = sorted(fused, key=lambda doc: (-fused[doc], min(ranks[doc].values()), doc))
    if limit is not None:
        order = order[:limit]
    return [
        FusedHit(doc, fused[doc], rank, ranks[doc], scores[doc])
        for rank, doc in enumerate(order, 1)
    ]
