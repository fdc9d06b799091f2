"""A real, deterministic `Embedder` for build tests that compare files: character bigrams of
the normalised text hashed into 64 buckets, counted, unit length. It embeds in microseconds, so
a test can build dense indexes of hundreds of chunks; its vectors say nothing about recall."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from numpy.typing import NDArray

from residency.normalize import normalize_text
from residency.retrieval.embedders import l2_normalize


class HashEmbedder:
    """Bigram counts in `dim` buckets; `calls` records the size of every passage batch."""

    name = "test-hash-64"
    dim = 64

    def __init__(self) -> None:
        self.calls: list[int] = []

    def _embed(self, texts: Sequence[str]) -> NDArray[np.float32]:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            codes = np.frombuffer(normalize_text(text).encode("utf-32-le"), dtype=np.uint32)
            codes = codes.astype(np.int64)
            if len(codes) > 1:
                out[row] = np.bincount((codes[:-1] * 7919 + codes[1:]) % self.dim, minlength=64)
        return l2_normalize(out)

    def embed_queries(self, texts: Sequence[str]) -> NDArray[np.float32]:
        """Query vectors (the same hashing as passages)."""
        return self._embed(texts)

    def embed_passages(
        self, texts: Sequence[str], progress: Callable[[int], None] | None = None
    ) -> NDArray[np.float32]:
        """Passage vectors; `progress(len(texts))` once."""
        self.calls.append(len(texts))
        out = self._embed(texts)
        if progress is not None:
            progress(len(texts))
        return out
