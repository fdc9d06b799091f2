"""What `residency index --to qdrant` uploads: an index directory's chunks, vectors, identity."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from numpy.typing import NDArray

from residency.corpus.model import Chunk, Section
from residency.errors import ConfigError
from residency.index.manifest import (
    BM25_DIR,
    CHUNKS_FILE,
    SECTIONS_FILE,
    VECTOR_KEYS_FILE,
    VECTORS_FILE,
    read_jsonl,
    read_manifest,
)
from residency.index.qdrant_backend import index_chunks_hash
from residency.retrieval import Tokenizer, get_tokenizer
from residency.retrieval.qdrant_schema import date_value


@dataclass(frozen=True, slots=True)
class UploadChunk:
    """One chunk as a point: ids, content hash, corpus order, date and the text BM25 reads."""

    chunk_id: str
    section_id: str
    content_hash: str
    order: int
    date: dt.date | None
    index_text: str

    def payload(self, vectors: Sequence[str]) -> dict[str, Any]:
        """The point's payload (no ``date`` key for an undated chunk: range filters skip it)."""
        out: dict[str, Any] = {
            "chunk_id": self.chunk_id,
            "section_id": self.section_id,
            "content_hash": self.content_hash,
            "order": self.order,
            "vectors": sorted(vectors),
        }
        if self.date is not None:
            out["date"] = date_value(self.date)
        return out


@dataclass(frozen=True)
class UploadSource:
    """What gets uploaded: the chunks, their vectors by content hash, and their identity."""

    chunks: Sequence[UploadChunk]
    vector_of: Callable[[str], NDArray[np.float32]]
    embedder: str
    dim: int
    tokenizer: Tokenizer
    normalization: str
    k1: float
    b: float
    chunks_hash: str
    corpus_hash: str
    index_dir: str


def source_from_index(index_dir: Path) -> UploadSource:
    """The upload source of a built index directory (dense vectors required)."""
    manifest = read_manifest(index_dir)
    if manifest.embedder is None:
        raise ConfigError(
            f"index {index_dir} was built --no-dense; a Qdrant collection needs its dense "
            "vectors: rebuild it without --no-dense"
        )
    sections = read_jsonl(index_dir / SECTIONS_FILE, Section)
    chunks = read_jsonl(index_dir / CHUNKS_FILE, Chunk)
    date_of = {s.id: s.date for s in sections}
    keys = orjson.loads((index_dir / VECTOR_KEYS_FILE).read_bytes())
    matrix = np.load(index_dir / VECTORS_FILE, mmap_mode="r")
    row_of = {str(k): i for i, k in enumerate(keys)}
    params = orjson.loads((index_dir / BM25_DIR / "bm25.meta.json").read_bytes())
    return UploadSource(
        chunks=[
            UploadChunk(
                c.id, c.section_id, c.content_hash, c.order, date_of[c.section_id], c.index_text
            )
            for c in chunks
        ],
        vector_of=lambda h: np.asarray(matrix[row_of[h]], dtype=np.float32),
        embedder=manifest.embedder.name,
        dim=manifest.embedder.dim,
        tokenizer=get_tokenizer(manifest.sparse_tokenizer),
        normalization=manifest.normalization_version,
        k1=float(params["k1"]),
        b=float(params["b"]),
        chunks_hash=index_chunks_hash(sections, chunks),
        corpus_hash=manifest.corpus_hash,
        index_dir=str(index_dir.resolve()),
    )
