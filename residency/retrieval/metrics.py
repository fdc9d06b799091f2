"""Section-level retrieval metrics: pure functions of one question's ranking and its gold ids,
shared by `residency eval retrieval` and the router's recall canary.

recall@k is the share of a question's relevant sections in the top k (a question with two gold
sections scores at most 0.5 at k=1); MRR@10 counts the first relevant one; nDCG@10 is binary.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence

K_VALUES = (1, 3, 5, 10)


def recall_at_k(ranked: Sequence[str], relevant: Collection[str], k: int) -> float:
    """Share of the relevant ids found in the top k.

    >>> recall_at_k(["a", "b", "c"], {"c", "z"}, 3)
    0.5
    """
    if not relevant:
        raise ValueError("recall needs at least one relevant id")
    return len(set(ranked[:k]) & set(relevant)) / len(set(relevant))


def mrr_at_k(ranked: Sequence[str], relevant: Collection[str], k: int) -> float:
    """1 / rank of the first relevant id in the top k, else 0.

    >>> mrr_at_k(["a", "b", "c"], {"c"}, 10)
    0.3333333333333333
    """
    for rank, doc in enumerate(ranked[:k], start=1):
        if doc in relevant:
            return 1.0 / rank
    return 0.0


def ndcg_at_k(ranked: Sequence[str], relevant: Collection[str], k: int) -> float:
    """Binary-relevance nDCG: sum 1/log2(rank+1) over relevant hits, over the ideal ordering.

    >>> round(ndcg_at_k(["a", "b"], {"b"}, 10), 4)   # 1/log2(3)
    0.6309
    """
    if not relevant:
        raise ValueError("nDCG needs at least one relevant id")
    dcg = sum(1.0 / math.log2(r + 1) for r, d in enumerate(ranked[:k], 1) if d in relevant)
    ideal = sum(1.0 / math.log2(r + 1) for r in range(1, min(len(set(relevant)), k) + 1))
    return dcg / ideal


def question_metrics(ranked: Sequence[str], relevant: Collection[str]) -> dict[str, float]:
    """Every metric of one question's section ranking, keyed by MetricSet field."""
    out = {f"recall_at_{k}": recall_at_k(ranked, relevant, k) for k in K_VALUES}
    out["mrr_at_10"] = mrr_at_k(ranked, relevant, 10)
    out["ndcg_at_10"] = ndcg_at_k(ranked, relevant, 10)
    return out
