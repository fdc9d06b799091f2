"""Opening an index directory for search (`build_index`, in `residency.index.build`, writes it).

`open_index` returns an `Index` whose `search` is **section-level** (chunk hits mapped to their
section, a section ranked at its best chunk): the unit the planner and the retrieval eval reason
about; `search_chunks` gives the chunk-level hits the router cites.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Protocol

from numpy.typing import NDArray

from residency.corpus.model import Chunk, Section, SectionHit, collapse_to_sections
from residency.errors import ConfigError
from residency.index.build import build_index as build_index
from residency.index.manifest import (
    BM25_DIR,
    CHUNKS_FILE,
    DENSE_DIR,
    SECTIONS_FILE,
    IndexManifest,
    load_index_part,
    read_jsonl,
    read_manifest,
)
from residency.prompt_language import PromptLanguage, detect_language
from residency.retrieval import (
    BM25Retriever,
    DenseRetriever,
    Embedder,
    FusedHit,
    HybridRetriever,
    Retriever,
    Tokenizer,
    get_embedder,
    get_tokenizer,
)
from residency.retrieval.protocol import DenseSearch, FusedSearch


@dataclass(frozen=True, slots=True)
class IndexRetrievers:
    """The index's retrievers over chunk ids: BM25, dense (None if built --no-dense), fused."""

    bm25: Retriever
    dense: DenseSearch | None
    hybrid: FusedSearch


class RetrievalBackend(Protocol):
    """Where an opened index searches instead of its own BM25 + FAISS files (e.g. Qdrant)."""

    name: str

    def describe(self) -> str:
        """Where it searches, for reports (e.g. the Qdrant location and collection)."""
        ...

    def open(
        self,
        index: Index,
        embedder: Embedder | None,
        tokenizer: Tokenizer,
        weights: dict[str, float] | None,
    ) -> IndexRetrievers:
        """The retrievers over the index's chunk ids, checked against its manifest."""
        ...


class Index:
    """An opened index: its manifest, sections and chunks in corpus order, and search."""

    def __init__(
        self,
        directory: Path,
        manifest: IndexManifest,
        sections: Sequence[Section],
        chunks: Sequence[Chunk],
        embedder: Embedder | str | None,
        tokenizer: Tokenizer,
        weights: dict[str, float] | None = None,
        backend: RetrievalBackend | None = None,
    ) -> None:
        self.directory = directory
        self.manifest = manifest
        self.sections: tuple[Section, ...] = tuple(sections)
        self.chunks: tuple[Chunk, ...] = tuple(chunks)
        self._section_by_id = {s.id: s for s in self.sections}
        self._chunk_by_id = {c.id: c for c in self.chunks}
        self._chunk_section = {c.id: c.section_id for c in self.chunks}
        by_section: dict[str, list[Chunk]] = {}
        for c in self.chunks:
            by_section.setdefault(c.section_id, []).append(c)
        self._chunks_by_section = {k: tuple(v) for k, v in by_section.items()}
        self._embedder = embedder
        self._tokenizer = tokenizer
        self._weights = weights
        self.backend = backend

    def section(self, section_id: str) -> Section:
        """The section with this id (KeyError if none)."""
        return self._section_by_id[section_id]

    def has_section(self, section_id: str) -> bool:
        """True when the index holds a section with this id."""
        return section_id in self._section_by_id

    def chunk(self, chunk_id: str) -> Chunk:
        """The chunk with this id (KeyError if none)."""
        return self._chunk_by_id[chunk_id]

    def section_of(self, chunk_id: str) -> str:
        """The section id of a chunk id."""
        return self._chunk_section[chunk_id]

    def chunks_of(self, section_id: str) -> tuple[Chunk, ...]:
        """The chunks of one section, in order (empty for an unknown id)."""
        return self._chunks_by_section.get(section_id, ())

    @cached_property
    def language(self) -> PromptLanguage:
        """The corpus language the prompts are worded in (read off the sections' text)."""
        return detect_language(s.title + "\n" + s.text for s in self.sections)

    @cached_property
    def _retrievers(self) -> IndexRetrievers:
        embedder = (
            get_embedder(self._embedder) if isinstance(self._embedder, str) else self._embedder
        )
        if self.backend is not None:
            return self.backend.open(self, embedder, self._tokenizer, self._weights)
        bm25 = load_index_part(self.directory, BM25_DIR, BM25Retriever.load, self._tokenizer)
        dense = None
        if embedder is not None:
            dense = load_index_part(self.directory, DENSE_DIR, DenseRetriever.load, embedder)
        parts: list[Retriever] = [bm25] if dense is None else [dense, bm25]
        return IndexRetrievers(bm25, dense, HybridRetriever(parts, self._weights))

    def retrievers(self) -> IndexRetrievers:
        """BM25, dense and hybrid retrievers over chunk ids (loaded on first use)."""
        return self._retrievers

    def search_chunks(self, query: str, k: int) -> list[FusedHit]:
        """The fused top-`k` chunks (chunk-level; what the router cites)."""
        return self._retrievers.hybrid.search(query, k)

    def search_all(
        self, query: str, k: int, query_vector: NDArray[Any] | None = None
    ) -> dict[str, list[SectionHit]]:
        """Section-level top-`k` of every retriever ('bm25', 'dense', 'hybrid') in one pass."""
        fetch = max(k, self._retrievers.hybrid.prefetch)
        while True:
            lists = self._retrievers.hybrid.search_all(query, fetch, query_vector)
            out = {
                name: collapse_to_sections(hits, self.section_of, k) for name, hits in lists.items()
            }
            # Several chunks of one section can fill the list: fetch more until k sections.
            short = any(len(out[n]) < k and len(lists[n]) == fetch for n in lists)
            if not short or fetch >= len(self.chunks):
                return out
            fetch = min(2 * fetch, len(self.chunks))

    def search(self, query: str, k: int) -> list[SectionHit]:
        """The top-`k` sections by the hybrid retriever (**section-level**, best chunk's rank)."""
        return self.search_all(query, k)["hybrid"]


def open_index(
    directory: Path,
    *,
    embedder: Embedder | str | None = None,
    sparse_tokenizer: Tokenizer | str | None = None,
    weights: dict[str, float] | None = None,
    backend: RetrievalBackend | None = None,
) -> Index:
    """Open an index; the embedder / BM25 tokenizer default to (and must equal) the manifest's.

    ``backend`` (e.g. `QdrantBackend`) searches instead of the index's BM25 + FAISS files."""
    manifest = read_manifest(directory)
    built = manifest.embedder
    wanted = embedder if isinstance(embedder, str) or embedder is None else embedder.name
    if wanted is not None and (built is None or wanted != built.name):
        raise ConfigError(
            f"index {directory} was built with embedder "
            f"{built.name if built else 'none (--no-dense)'!r}; querying with {wanted!r} would "
            "silently lose recall: query with the index's embedder or rebuild with --embedder"
        )
    tok = (
        sparse_tokenizer
        if isinstance(sparse_tokenizer, str) or sparse_tokenizer is None
        else sparse_tokenizer.name
    )
    if tok is not None and tok != manifest.sparse_tokenizer:
        raise ConfigError(
            f"index {directory} was built with BM25 tokenizer {manifest.sparse_tokenizer!r}; "
            f"querying with {tok!r} would silently lose recall: rebuild with --sparse-tokenizer"
        )
    # The embedder is built on first search (loading a model is not free).
    query_embedder: Embedder | str | None = None
    if built is not None:
        query_embedder = embedder if embedder is not None else built.name
    tokenizer = (
        get_tokenizer(manifest.sparse_tokenizer)
        if sparse_tokenizer is None or isinstance(sparse_tokenizer, str)
        else sparse_tokenizer
    )
    sections = read_jsonl(directory / SECTIONS_FILE, Section)
    chunks = read_jsonl(directory / CHUNKS_FILE, Chunk)
    if (len(sections), len(chunks)) != (manifest.section_count, manifest.chunk_count):
        raise ConfigError(
            f"index {directory} is damaged: manifest lists {manifest.section_count} sections / "
            f"{manifest.chunk_count} chunks, files hold {len(sections)} / {len(chunks)}; rebuild it"
        )
    return Index(directory, manifest, sections, chunks, query_embedder, tokenizer, weights, backend)
