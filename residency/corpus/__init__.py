"""The corpus layer: files into sections with stable ids, sections into chunks (semantic chunking
embeds with retrieval's embedders), the built-in samples and the SQuAD importer.

May import: the cross-cutting modules, retrieval.
"""

from __future__ import annotations

from residency.corpus.chunking import ChunkerSettings, chunk_sections
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
