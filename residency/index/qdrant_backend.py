"""An index whose searches go to its Qdrant collection (`open_index(..., backend=QdrantBackend)`).

Sections, chunks and the manifest still come from the index directory (the router renders chunk
text from it); the BM25 and FAISS files are not read. The collection must hold exactly this
index's chunks with this embedder's vectors and this tokenizer's terms (see qdrant.py).
"""

from __future__ import annotations

from collections.abc import Sequence

from residency.corpus.model import Chunk, Section
from residency.errors import ConfigError
from residency.index.store import Index, IndexRetrievers
from residency.normalize import NORMALIZATION_VERSION
from residency.retrieval import DEFAULT_WEIGHTS, Embedder, Tokenizer
from residency.retrieval.qdrant import CollectionIdentity, QdrantHybrid, QdrantPath, QdrantSearch
from residency.retrieval.qdrant_schema import (
    QdrantOptions,
    check_name,
    chunks_hash,
    connect,
    default_collection,
)


def index_chunks_hash(sections: Sequence[Section], chunks: Sequence[Chunk]) -> str:
    """`chunks_hash` of an index's chunks (with their sections' dates)."""
    date_of = {s.id: s.date for s in sections}
    return chunks_hash(
        [(c.id, c.section_id, c.content_hash, date_of[c.section_id]) for c in chunks]
    )


class QdrantBackend:
    """Opens an index's retrievers on its Qdrant collection; name ``qdrant``."""

    name = "qdrant"

    def __init__(self, options: QdrantOptions) -> None:
        self.options = options
        self.search: QdrantSearch | None = None  # set by `open`

    def describe(self) -> str:
        """'LOCATION collection C, vector V, fusion F' (the collection once opened)."""
        where = self.options.location
        if self.search is None:
            return where
        s = self.search
        return (
            f"{where} collection {s.collection}, vector {s.vector_name}, fusion {s.options.fusion}"
        )

    def collection_of(self, index: Index) -> str:
        """--collection, or the index directory's name."""
        name = self.options.collection or default_collection(index.directory)
        return check_name(name, "--collection")

    def open(
        self,
        index: Index,
        embedder: Embedder | None,
        tokenizer: Tokenizer,
        weights: dict[str, float] | None,
    ) -> IndexRetrievers:
        """Connect, check the collection against the manifest, and wrap its two paths."""
        built = index.manifest.embedder
        if built is None or embedder is None:
            raise ConfigError(
                f"index {index.directory} was built --no-dense; the Qdrant backend needs its "
                "dense vectors: rebuild it without --no-dense"
            )
        identity = CollectionIdentity(
            embedder=built.name,
            dim=built.dim,
            sparse_tokenizer=index.manifest.sparse_tokenizer,
            normalization=NORMALIZATION_VERSION,
            chunks_hash=index_chunks_hash(index.sections, index.chunks),
            source=str(index.directory),
        )
        known = frozenset(c.id for c in index.chunks)
        client = connect(self.options)
        search = QdrantSearch.open(
            client, self.options, self.collection_of(index), identity, embedder, tokenizer, known
        )
        self.search = search
        chosen = dict(DEFAULT_WEIGHTS if weights is None else weights)
        return IndexRetrievers(
            bm25=QdrantPath(search, "bm25"),
            dense=QdrantPath(search, "dense"),
            hybrid=QdrantHybrid(search, chosen, self.options.prefetch),
        )
