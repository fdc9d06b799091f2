"""Writing a dense index from vectors that arrive in batches: the files
`DenseRetriever.from_vectors(...).save(...)` writes, without one matrix of every vector.

A flat index (up to the HNSW threshold) is written straight to ``dense.faiss``: FAISS's
``IndexFlatIP`` file is a fixed header and then the vectors, so each batch is appended as it
comes and the build holds one batch. The header is FAISS's own (``faiss.serialize_index`` of an
empty index, its two counts set), and before trusting that layout the writer checks it against
FAISS on a small probe index; if FAISS ever writes otherwise, the writer keeps the vectors in a
FAISS index and lets FAISS write it, as `DenseRetriever.save` does. An HNSW index is built in
FAISS's memory either way (the graph needs every vector): vectors are added batch by batch.
"""

from __future__ import annotations

import struct
from functools import lru_cache
from pathlib import Path
from typing import Any, BinaryIO

import faiss
import numpy as np
from numpy.typing import NDArray

from residency.retrieval.dense import (
    DEFAULT_HNSW_THRESHOLD,
    INDEX_FILE,
    META_FILE,
    DenseMeta,
    IndexKind,
    empty_faiss_index,
    index_kind_for,
)
from residency.retrieval.embedders import Embedder, l2_normalize
from residency.retrieval.stored import write_meta_with_ids

# IndexFlatIP as faiss/impl/index_write.cpp writes it: fourcc "IxFI", d (int32), ntotal (int64),
# two dummies (int64), is_trained (bool), metric_type (int32), then the codes as a vector:
# its length in floats (uint64) and the floats. Offsets of the two counts:
_NTOTAL_AT = slice(8, 16)
_FLOATS_AT_END = 8


def _flat_header(dim: int, n: int) -> bytes:
    empty = bytearray(faiss.serialize_index(faiss.IndexFlatIP(dim)).tobytes())
    empty[_NTOTAL_AT] = struct.pack("<q", n)
    empty[-_FLOATS_AT_END:] = struct.pack("<Q", n * dim)
    return bytes(empty)


@lru_cache(maxsize=8)
def flat_layout_holds(dim: int) -> bool:
    """True when FAISS writes an IndexFlatIP of `dim` as `_flat_header` + raw float32 rows."""
    try:
        probe = np.random.default_rng(7).standard_normal((3, dim)).astype(np.float32)
        index = faiss.IndexFlatIP(dim)
        index.add(probe)
        expected = faiss.serialize_index(index).tobytes()
        return expected == _flat_header(dim, 3) + probe.tobytes()
    except (RuntimeError, ValueError, struct.error):
        return False


class DenseWriter:
    """Add `total` passage vectors in batches (row i is the i-th id), then `write`."""

    def __init__(
        self,
        directory: Path,
        embedder: Embedder,
        total: int,
        hnsw_threshold: int = DEFAULT_HNSW_THRESHOLD,
    ) -> None:
        self.directory, self.embedder, self.total = directory, embedder, total
        self.added = 0
        self.index_kind: IndexKind = index_kind_for(total, hnsw_threshold)
        self._file: BinaryIO | None = None
        self._index: Any = None
        if self.index_kind == "flat-ip" and flat_layout_holds(embedder.dim):
            self._file = (directory / INDEX_FILE).open("wb")
            self._file.write(_flat_header(embedder.dim, total))
        else:
            self._index = empty_faiss_index(embedder.dim, self.index_kind)

    def add(self, vectors: NDArray[Any]) -> None:
        """The next rows, re-normalised to unit length (as `DenseRetriever.from_vectors` does)."""
        rows = l2_normalize(vectors)
        if rows.shape[1] != self.embedder.dim:
            raise ValueError(
                f"vectors have dimension {rows.shape[1]}; "
                f"embedder {self.embedder.name!r} gives {self.embedder.dim}"
            )
        if self.added + len(rows) > self.total:
            raise ValueError(f"{self.added + len(rows)} vectors added, {self.total} announced")
        if self._file is not None:
            self._file.write(rows.tobytes())
        else:
            self._index.add(rows)
        self.added += len(rows)

    def write(self, ids_file: Path) -> None:
        """Finish ``dense.faiss`` and write ``dense.meta.json`` (ids from `ids_file`, one JSON
        string per line, one per vector)."""
        if self.added != self.total:
            raise ValueError(f"{self.added} vectors added, {self.total} announced")
        if self._file is not None:
            self._file.close()
        else:
            faiss.write_index(self._index, str(self.directory / INDEX_FILE))
            self._index = None
        meta = DenseMeta.written_now(self.embedder, self.index_kind, ["-"])
        write_meta_with_ids(self.directory / META_FILE, meta, ids_file)

    def close(self) -> None:
        """Release the file or index (after an error)."""
        if self._file is not None and not self._file.closed:
            self._file.close()
        self._index = None
