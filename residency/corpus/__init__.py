"""The corpus layer: files into sections with stable ids, sections into chunks (semantic chunking
embeds with retrieval's embedders), the built-in samples and the SQuAD importer.

May import: the cross-cutting modules, retrieval.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from residency.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from residency.corpus.chunker_settings import ChunkerSettings
    from residency.corpus.chunking import chunk_sections
    from residency.corpus.loader import Corpus, load_corpus, slugify
    from residency.corpus.model import Chunk, Section, SectionHit, SkippedInput, SourceFile

__all__ = [
    "Chunk",
    "ChunkerSettings",
    "Corpus",
    "Section",
    "SectionHit",
    "SkippedInput",
    "SourceFile",
    "chunk_sections",
    "load_corpus",
    "slugify",
]

__getattr__ = lazy_exports(__name__, __file__)
