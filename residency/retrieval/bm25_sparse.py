"""BM25 as sparse vectors for an engine that applies IDF itself (Qdrant's ``Modifier.IDF``).

bm25s (lucene variant) scores a document d for a query q as

    score(q, d) = sum over query tokens t (repeats counted) of idf(t) * tfc(t, d)
    tfc(t, d)   = tf / (tf + k1 * (1 - b + b * |d| / avgdl))
    idf(t)      = ln(1 + (N - df + 0.5) / (df + 0.5))

and Qdrant's IDF modifier multiplies each *query* value by ``ln((N - df + 0.5) / (df + 0.5) + 1)``
(``qdrant_client/local/local_collection.py: _compute_idf``; the server's ``idf`` is the same
formula), the same idf, with N and df counted over the points that carry the sparse vector. So a
document vector holding ``tfc`` per term and a query vector holding each term's *count* give
``sum count * idf * tfc``: bm25s's score, term for term. Worked example (k1 1.5, b 0.75,
avgdl 10): a term twice in a 10-token document has tfc = 2 / (2 + 1.5) = 0.571429; in 1,000
documents of which 9 hold it, idf = ln(1 + 991.5 / 9.5) = 4.657; asked once it adds 2.661.

Where the two can still differ (measured on JSQuAD in tests/test_retrieval_qdrant.py):
- Term ids are a 32-bit hash of the term (Qdrant's sparse indices are u32 and must not depend on
  one build's vocabulary numbering). Two terms of one corpus collide with probability about
  V^2 / 2^33 for V distinct terms (~1 pair at 100K terms, ~100 at 1M); a collision merges their
  document frequencies (and, inside one document, their tfc values are summed).
- ``avgdl`` is fixed when a collection is created (recorded in its metadata) so that re-uploading
  an unchanged chunk uploads nothing; after the corpus grows, bm25s's avgdl moves and Qdrant's
  does not: length normalisation then differs by the ratio of the two (the upload reports it).
- Float rounding (float32 tfc times the server's idf) can swap two documents whose scores agree
  to about 1e-6; exact ties stay ties, and the retriever breaks them by corpus order as bm25s does.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

# Recorded in a collection's metadata: a change here must not meet an old collection silently.
TERM_HASH = "blake2b-32-v1"


def term_index(term: str) -> int:
    """The sparse index of a term: the first 4 bytes of its blake2b digest, little-endian."""
    return int.from_bytes(hashlib.blake2b(term.encode("utf-8"), digest_size=4).digest(), "little")


@dataclass(frozen=True, slots=True)
class SparseTerms:
    """A sparse vector: sorted unique u32 indices and their values."""

    indices: tuple[int, ...]
    values: tuple[float, ...]


class TermHasher:
    """`term_index` with a cache (a corpus repeats its terms millions of times)."""

    __slots__ = ("_cache",)

    def __init__(self) -> None:
        self._cache: dict[str, int] = {}

    def __call__(self, term: str) -> int:
        """The term's sparse index."""
        index = self._cache.get(term)
        if index is None:
            index = self._cache[term] = term_index(term)
        return index


def _collect(pairs: Iterable[tuple[int, float]]) -> SparseTerms:
    """Sum values per index (hash collisions) and sort by index."""
    summed: dict[int, float] = {}
    for index, value in pairs:
        summed[index] = summed.get(index, 0.0) + value
    order = sorted(summed)
    return SparseTerms(tuple(order), tuple(summed[i] for i in order))


def document_vector(
    tokens: Sequence[str], avgdl: float, k1: float, b: float, hasher: TermHasher | None = None
) -> SparseTerms:
    """tfc per distinct term of one document (its length is ``len(tokens)``, as in bm25s)."""
    if avgdl <= 0:
        raise ValueError(f"avgdl must be > 0, got {avgdl}")
    hash_term = hasher or TermHasher()
    norm = k1 * (1 - b + b * len(tokens) / avgdl)
    return _collect((hash_term(t), tf / (tf + norm)) for t, tf in Counter(tokens).items())


def query_vector(tokens: Sequence[str], hasher: TermHasher | None = None) -> SparseTerms:
    """Each distinct query term's count (bm25s counts a repeated query term once per repeat)."""
    hash_term = hasher or TermHasher()
    return _collect((hash_term(t), float(n)) for t, n in Counter(tokens).items())


def average_length(token_lists: Iterable[Sequence[str]]) -> float:
    """Mean number of tokens per document (bm25s's avgdl); 1.0 for an empty corpus."""
    total = count = 0
    for tokens in token_lists:
        total += len(tokens)
        count += 1
    return total / count if count and total else 1.0
