"""Retrieval through a Qdrant collection: the same `Retriever` contract as BM25 / FAISS in process.

One round trip per question: a batch of two queries (the dense vector and the BM25 sparse
vector, each its top ``prefetch``), fused here by `fuse_rrf` with the same weights and k as
`HybridRetriever`, so the ranking matches the in-process fusion (JSQuAD: see
tests/test_retrieval_qdrant.py). ``fusion="qdrant-rrf"`` lets the server fuse instead (one more
query in the batch). Qdrant scores a prefetch rank r (1-based) with weight w as
``1 / (r / w + k - 1)`` (``qdrant_client/hybrid/fusion.py``): with w = 1 and k = 61 that is
Cormack's ``1 / (60 + r)``, but with weights it is ``w / (r + w (k - 1))``, not residency's
``w / (k + r)``, so weighted server fusion ranks differently: an option, not the default.

Ties: bm25s and FAISS order equal scores by corpus row; Qdrant by its own internal order. Each
path fetches ``TIE_SLACK`` extra points and re-sorts by (score, corpus order) before cutting.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import threading
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from residency.errors import ConfigError
from residency.retrieval.bm25_sparse import TermHasher, query_vector
from residency.retrieval.embedders import Embedder
from residency.retrieval.fusion import RRF_K, FusedHit, fuse_rrf
from residency.retrieval.protocol import Hit, check_k
from residency.retrieval.qdrant_schema import (
    SPARSE_VECTOR,
    CollectionRecord,
    QdrantOptions,
    backend_errors,
    date_value,
    read_record,
)
from residency.retrieval.tokenize_ja import Tokenizer

if TYPE_CHECKING:
    from qdrant_client import QdrantClient, models

TIE_SLACK = 8
_PAYLOAD = ["chunk_id", "order"]


@dataclass(frozen=True, slots=True)
class CollectionIdentity:
    """What the querying index says its vectors are; the collection must say the same."""

    embedder: str
    dim: int
    sparse_tokenizer: str
    normalization: str
    chunks_hash: str
    source: str  # the index directory, for messages


@dataclass(frozen=True, slots=True)
class SearchFilter:
    """Server-side restrictions: dated notes in [date_from, date_to], or these sections only."""

    date_from: dt.date | None = None
    date_to: dt.date | None = None
    section_ids: tuple[str, ...] = ()

    def to_qdrant(self) -> models.Filter:
        """The Qdrant filter (integer range on ``date``, keyword match on ``section_id``)."""
        from qdrant_client import models

        must: list[models.Condition] = []
        if self.date_from is not None or self.date_to is not None:
            must.append(
                models.FieldCondition(
                    key="date",
                    range=models.Range(
                        gte=date_value(self.date_from) if self.date_from else None,
                        lte=date_value(self.date_to) if self.date_to else None,
                    ),
                )
            )
        if self.section_ids:
            must.append(
                models.FieldCondition(
                    key="section_id", match=models.MatchAny(any=list(self.section_ids))
                )
            )
        return models.Filter(must=must)


def dense_vector_for(record: CollectionRecord, identity: CollectionIdentity, name: str) -> str:
    """The named dense vector holding ``identity``'s embedder; ConfigError naming the fix."""
    if record.sparse_tokenizer != identity.sparse_tokenizer or (
        record.normalization != identity.normalization
    ):
        raise ConfigError(
            f"Qdrant collection {name!r} holds BM25 tokens of {record.sparse_tokenizer!r} "
            f"({record.normalization}); index {identity.source} uses "
            f"{identity.sparse_tokenizer!r} ({identity.normalization}): querying it would "
            "silently lose recall; upload this index into another --collection"
        )
    matches = sorted(
        v
        for v, r in record.vectors.items()
        if r.embedder == identity.embedder and r.dim == identity.dim
    )
    if not matches:
        held = ", ".join(f"{v}: {r.embedder} ({r.dim}-d)" for v, r in record.vectors.items())
        raise ConfigError(
            f"Qdrant collection {name!r} has no vector from embedder {identity.embedder!r} "
            f"({identity.dim}-d) of index {identity.source} (it holds {held}): querying another "
            "embedder's vectors would silently lose recall; upload this index with "
            "`residency index ... --to qdrant LOCATION --vector-name NAME`"
        )
    if record.chunks_hash != identity.chunks_hash:
        raise ConfigError(
            f"Qdrant collection {name!r} holds other chunks than index {identity.source} "
            f"(last upload from {record.index_dir} at {record.updated_at:%Y-%m-%d %H:%M} UTC): "
            "upload this index (`residency index ... --to qdrant`) or query with the index the "
            "collection was uploaded from"
        )
    stale = [v for v in matches if record.vectors[v].chunks_hash != identity.chunks_hash]
    if len(stale) == len(matches):
        raise ConfigError(
            f"Qdrant collection {name!r}: vector {matches[0]!r} was written for other chunks "
            f"than index {identity.source} holds (some points lack it): upload this index "
            f"again with --vector-name {matches[0]} to backfill it"
        )
    return next(v for v in matches if v not in stale)


class QdrantSearch:
    """An opened, checked collection and the two searches (dense + sparse) of one question."""

    def __init__(
        self,
        client: QdrantClient,
        options: QdrantOptions,
        collection: str,
        vector_name: str,
        record: CollectionRecord,
        embedder: Embedder,
        tokenizer: Tokenizer,
        known_ids: Collection[str],
    ) -> None:
        self.client = client
        self.options = options
        self.collection = collection
        self.vector_name = vector_name
        self.record = record
        self.fusion = options.fusion
        self.embedder = embedder
        self.tokenizer = tokenizer
        self.unknown_hits = 0  # chunk ids the collection returned but the index lacks
        self._known = known_ids
        self._hasher = TermHasher()
        # Embedded mode is a Python object without locking; a server client (httpx) is
        # thread-safe and needs none.
        self._lock = threading.Lock() if not options.is_server else None

    @classmethod
    def open(
        cls,
        client: QdrantClient,
        options: QdrantOptions,
        collection: str,
        identity: CollectionIdentity,
        embedder: Embedder,
        tokenizer: Tokenizer,
        known_ids: Collection[str],
    ) -> QdrantSearch:
        """Check the collection against ``identity`` and pick its dense vector."""
        if embedder.name != identity.embedder or embedder.dim != identity.dim:
            raise ConfigError(
                f"query embedder {embedder.name!r} ({embedder.dim}-d) is not index "
                f"{identity.source}'s {identity.embedder!r} ({identity.dim}-d)"
            )
        with backend_errors(options):
            record = read_record(client, collection)
        if record is None:
            raise ConfigError(
                f"--qdrant {options.location} has no collection {collection!r}: upload the "
                f"index first with `residency index CORPUS -o {identity.source} --to qdrant "
                f"{options.location}`"
            )
        vector = dense_vector_for(record, identity, collection)
        return cls(client, options, collection, vector, record, embedder, tokenizer, known_ids)

    def _requests(
        self, query: str, n: int, vector: NDArray[Any] | None, flt: SearchFilter | None
    ) -> tuple[list[float], models.SparseVector, models.Filter | None]:
        from qdrant_client import models

        dense = self.embedder.embed_queries([query])[0] if vector is None else vector
        sparse = query_vector(self.tokenizer.tokenize_query(query), self._hasher)
        return (
            np.asarray(dense, dtype=np.float32).reshape(-1).tolist(),
            models.SparseVector(indices=list(sparse.indices), values=list(sparse.values)),
            flt.to_qdrant() if flt is not None else None,
        )

    def _run(self, requests: list[models.QueryRequest]) -> list[list[models.ScoredPoint]]:
        with self._lock or contextlib.nullcontext(), backend_errors(self.options):
            responses = self.client.query_batch_points(
                self.collection, requests, timeout=self.options.timeout_s
            )
        return [r.points for r in responses]

    def _hits(self, points: Sequence[models.ScoredPoint], n: int, positive: bool) -> list[Hit]:
        """Known chunk ids, best first, equal scores in corpus order, at most ``n``."""
        rows: list[tuple[float, int, str]] = []
        for p in points:
            payload = p.payload or {}
            chunk_id = str(payload.get("chunk_id", ""))
            if chunk_id not in self._known:
                self.unknown_hits += 1
                continue
            if positive and not p.score > 0:
                continue
            rows.append((-p.score, int(payload.get("order", 0)), chunk_id))
        rows.sort()
        return [Hit(cid, -neg, rank) for rank, (neg, _, cid) in enumerate(rows[:n], 1)]

    def lists(
        self,
        query: str,
        n: int,
        vector: NDArray[Any] | None = None,
        flt: SearchFilter | None = None,
        fused: tuple[Mapping[str, float], int, int] | None = None,
    ) -> tuple[dict[str, list[Hit]], list[Hit] | None]:
        """({'dense': top n, 'bm25': top n}, server-fused top k or None) in one round trip.

        ``fused`` = (weights, rrf k, limit) adds Qdrant's own RRF over the same prefetches.
        """
        from qdrant_client import models

        check_k(n)
        dense, sparse, qfilter = self._requests(query, n, vector, flt)
        limit = n + TIE_SLACK
        paths = [
            models.QueryRequest(
                query=dense,
                using=self.vector_name,
                limit=limit,
                filter=qfilter,
                with_payload=_PAYLOAD,
            ),
            models.QueryRequest(
                query=sparse,
                using=SPARSE_VECTOR,
                limit=limit,
                filter=qfilter,
                with_payload=_PAYLOAD,
            ),
        ]
        requests = list(paths)
        if fused is not None:
            requests.append(self._fused_request(dense, sparse, qfilter, n, fused))
        responses = self._run(requests)
        out = {
            "dense": self._hits(responses[0], n, positive=False),
            "bm25": self._hits(responses[1], n, positive=True),
        }
        server = self._hits(responses[2], fused[2], False) if fused is not None else None
        return out, server

    def _fused_request(
        self,
        dense: list[float],
        sparse: models.SparseVector,
        qfilter: models.Filter | None,
        n: int,
        fused: tuple[Mapping[str, float], int, int],
    ) -> models.QueryRequest:
        """Qdrant's own RRF over the dense and sparse prefetches (weights, rrf k, limit)."""
        from qdrant_client import models

        weights, rrf_k, k = fused
        w = [float(weights.get("dense", 1.0)), float(weights.get("bm25", 1.0))]
        if w[0] != w[1] and "weights" not in models.Rrf.model_fields:
            raise ConfigError(
                f"--qdrant-fusion qdrant-rrf with weights dense {w[0]:g} : bm25 {w[1]:g} "
                "needs a qdrant-client (and server) with weighted RRF; upgrade it, or use "
                "--qdrant-fusion rrf"
            )
        return models.QueryRequest(
            prefetch=[
                models.Prefetch(query=dense, using=self.vector_name, limit=n, filter=qfilter),
                models.Prefetch(query=sparse, using=SPARSE_VECTOR, limit=n, filter=qfilter),
            ],
            # k + 1: Qdrant's rank term is (r + k - 1), Cormack's (r + k).
            query=models.RrfQuery(rrf=models.Rrf(k=rrf_k + 1, weights=None if w[0] == w[1] else w)),
            limit=k,
            with_payload=_PAYLOAD,
        )


class QdrantPath:
    """One path of the collection (``dense`` or ``bm25``) as a `Retriever`."""

    def __init__(self, search: QdrantSearch, name: str) -> None:
        if name not in ("dense", "bm25"):
            raise ValueError(f"a Qdrant path is 'dense' or 'bm25', got {name!r}")
        self.name = name
        self._search = search
        self.embedder = search.embedder

    def search(self, query: str, k: int, flt: SearchFilter | None = None) -> list[Hit]:
        """The path's top ``k`` (both paths run: one round trip either way)."""
        return self._search.lists(query, k, None, flt)[0][self.name]

    def search_vector(self, vector: NDArray[Any], k: int) -> list[Hit]:
        """Dense path only: the top ``k`` for a precomputed query vector."""
        if self.name != "dense":
            raise ValueError("search_vector is for the dense path")
        return self._search.lists("", k, vector)[0]["dense"]


class QdrantHybrid:
    """Weighted RRF over the collection's dense and BM25 paths; name ``hybrid``."""

    name = "hybrid"

    def __init__(
        self,
        search: QdrantSearch,
        weights: Mapping[str, float],
        prefetch: int,
        rrf_k: int = RRF_K,
    ) -> None:
        check_k(prefetch)
        self.weights: dict[str, float] = {"dense": weights["dense"], "bm25": weights["bm25"]}
        self.prefetch = prefetch
        self.rrf_k = rrf_k
        self.fusion = search.options.fusion
        self._search = search

    def _fused(
        self, query: str, k: int, vector: NDArray[Any] | None, flt: SearchFilter | None
    ) -> tuple[dict[str, list[Hit]], list[FusedHit]]:
        n = max(k, self.prefetch)
        server_side = (self.weights, self.rrf_k, k) if self.fusion == "qdrant-rrf" else None
        lists, server = self._search.lists(query, n, vector, flt, server_side)
        if server is None:
            return lists, fuse_rrf(lists, self.weights, self.rrf_k, limit=k)
        ranks = {name: {h.id: h.rank for h in hits} for name, hits in lists.items()}
        scores = {name: {h.id: h.score for h in hits} for name, hits in lists.items()}
        return lists, [
            FusedHit(
                h.id,
                h.score,
                h.rank,
                {p: r[h.id] for p, r in ranks.items() if h.id in r},
                {p: s[h.id] for p, s in scores.items() if h.id in s},
            )
            for h in server
        ]

    def search(
        self,
        query: str,
        k: int,
        query_vector: NDArray[Any] | None = None,
        flt: SearchFilter | None = None,
    ) -> list[FusedHit]:
        """The fused top ``k`` (each path fetches ``max(k, prefetch)``), optionally filtered."""
        check_k(k)
        return self._fused(query, k, query_vector, flt)[1]

    def search_all(
        self, query: str, k: int, query_vector: NDArray[Any] | None = None
    ) -> dict[str, list[Hit] | list[FusedHit]]:
        """Each path's top ``k`` and the fused top ``k`` from one round trip."""
        check_k(k)
        lists, fused = self._fused(query, k, query_vector, None)
        out: dict[str, list[Hit] | list[FusedHit]] = {n: hits[:k] for n, hits in lists.items()}
        out[self.name] = fused
        return out
