"""Building an index directory atomically, reusing vectors, and opening it for search.

`build_index` does all its work inside a temp dir beside the target and swaps it in with one
rename (`residency.atomic`): an interrupted build leaves the old index as it was. Vectors are
keyed by the sha256 of each chunk's normalised index text, so re-indexing embeds only chunks
whose text changed. `open_index` returns an `Index` whose `search` is **section-level** (chunk
hits mapped to their section, a section ranked at its best chunk): the unit the planner and the
retrieval eval reason about; `search_chunks` gives the chunk-level hits the router cites.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import orjson
from numpy.typing import NDArray
from pydantic import BaseModel

from residency.atomic import atomic_directory, carry_over
from residency.corpus.chunking import (
    check_chunker_settings,
    chunk_sections,
    count_sentences_to_embed,
)
from residency.corpus.formats import READER_VERSION
from residency.corpus.loader import load_corpus
from residency.corpus.model import Chunk, Section, SectionHit, collapse_to_sections
from residency.errors import ConfigError, CorpusError
from residency.index.manifest import (
    BM25_DIR,
    CHUNKS_FILE,
    DENSE_DIR,
    INDEX_ARTEFACTS,
    INDEX_FORMAT_VERSION,
    MANIFEST_FILE,
    SECTIONS_FILE,
    VECTOR_KEYS_FILE,
    VECTORS_FILE,
    BuildProgress,
    BuildStats,
    EmbedderInfo,
    IndexManifest,
    load_index_part,
    manifest_bytes,
    previous_corpus,
    previous_spans,
    previous_vectors,
    read_jsonl,
    read_manifest,
)
from residency.index.options import IndexOptions
from residency.normalize import NORMALIZATION_VERSION
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
from residency.tokenizer import ModelTokenizer


def _check_target(corpus_dir: Path, index_dir: Path) -> None:
    if index_dir == corpus_dir or index_dir.is_relative_to(corpus_dir):
        raise ConfigError(
            f"-o {index_dir} lies inside the corpus directory {corpus_dir}: its "
            "files would be read as corpus; put the index outside it"
        )
    if corpus_dir.is_relative_to(index_dir):
        raise ConfigError(
            f"-o {index_dir} contains the corpus directory {corpus_dir}; "
            "replacing it would delete the corpus: pick another -o"
        )
    if index_dir.exists() and not index_dir.is_dir():
        raise ConfigError(f"-o {index_dir} is a file; pass a directory")
    if (
        index_dir.is_dir()
        and any(index_dir.iterdir())
        and not (index_dir / MANIFEST_FILE).is_file()
    ):
        raise ConfigError(
            f"-o {index_dir} exists, is not empty and holds no {MANIFEST_FILE}: "
            "refusing to replace a directory that is not an index; pass a new one"
        )


def _embed_chunks(
    chunks: Sequence[Chunk], embedder: Embedder, index_dir: Path, progress: BuildProgress | None
) -> tuple[list[str], NDArray[np.float32], int]:
    """(distinct content hashes, their vectors, chunks embedded now) reusing the old index."""
    old_rows, old_matrix = previous_vectors(index_dir, embedder)
    keys: list[str] = list(dict.fromkeys(c.content_hash for c in chunks))
    text_of = {c.content_hash: c.index_text for c in reversed(chunks)}
    todo = [k for k in keys if k not in old_rows]
    fresh_row: dict[str, int] = {}
    fresh: NDArray[np.float32] = np.zeros((0, embedder.dim), np.float32)
    if progress is not None:
        progress.start("embedding chunks", len(todo))
    matrix = np.empty((len(keys), embedder.dim), np.float32)
    if todo:
        fresh = embedder.embed_passages(
            [text_of[k] for k in todo], progress.advance if progress else None
        )
        fresh_row = {k: i for i, k in enumerate(todo)}
    for row, key in enumerate(keys):
        matrix[row] = fresh[fresh_row[key]] if key in fresh_row else old_matrix[old_rows[key]]
    return keys, matrix, sum(1 for c in chunks if c.content_hash not in old_rows)


def _jsonl(records: Sequence[BaseModel]) -> bytes:
    return b"".join(orjson.dumps(r.model_dump(mode="json")) + b"\n" for r in records)


def build_index(
    corpus_dir: Path,
    index_dir: Path,
    options: IndexOptions,
    counter: ModelTokenizer,
    progress: BuildProgress | None = None,
) -> IndexManifest:
    """Load, chunk, embed and index `corpus_dir` into `index_dir`, swapped in atomically."""
    started = time.perf_counter()
    corpus_dir, index_dir = corpus_dir.resolve(), index_dir.resolve()
    chunker = options.chunker
    if chunker.kind == "semantic":
        chunker = chunker.model_copy(update={"embedder": options.embedder})
    check_chunker_settings(chunker)
    _check_target(corpus_dir, index_dir)
    tokenizer = get_tokenizer(options.sparse_tokenizer)
    previous, old_sections = previous_corpus(index_dir)
    corpus = load_corpus(corpus_dir, counter, previous, progress)
    if options.strict and corpus.skipped:
        listed = "; ".join(f"{s.location()}: {s.reason}" for s in corpus.skipped[:5])
        raise CorpusError(
            f"--strict: {len(corpus.skipped)} input(s) would be skipped ({listed}"
            f"{'; ...' if len(corpus.skipped) > 5 else ''}); nothing written"
        )
    need_embedder = options.dense or chunker.kind == "semantic"
    embedder = get_embedder(options.embedder) if need_embedder else None
    with atomic_directory(index_dir) as tmp:
        known = (
            previous_spans(index_dir, corpus.sections, chunker, old_sections) if embedder else {}
        )
        sentences = count_sentences_to_embed(corpus.sections, chunker, known)
        if progress is not None and sentences:
            progress.start("embedding sentences (semantic chunker)", sentences)
        chunks = chunk_sections(
            corpus.sections, chunker, embedder, progress.advance if progress else None, known
        )
        BM25Retriever.build([c.id for c in chunks], [c.index_text for c in chunks], tokenizer).save(
            _mkdir(tmp / BM25_DIR)
        )
        embedded, info, keys = 0, None, list[str]()
        if options.dense and embedder is not None:
            keys, matrix, embedded = _embed_chunks(chunks, embedder, index_dir, progress)
            row_of = {k: i for i, k in enumerate(keys)}
            rows = [row_of[c.content_hash] for c in chunks]
            DenseRetriever.from_vectors([c.id for c in chunks], matrix[rows], embedder).save(
                _mkdir(tmp / DENSE_DIR)
            )
            np.save(tmp / VECTORS_FILE, matrix)
            (tmp / VECTOR_KEYS_FILE).write_bytes(orjson.dumps(keys))
            info = EmbedderInfo(name=embedder.name, dim=embedder.dim)
        (tmp / SECTIONS_FILE).write_bytes(_jsonl(corpus.sections))
        (tmp / CHUNKS_FILE).write_bytes(_jsonl(chunks))
        manifest = IndexManifest(
            format_version=INDEX_FORMAT_VERSION,
            created_at=dt.datetime.now(dt.UTC),
            corpus_dir=str(corpus_dir),
            corpus_hash=corpus.corpus_hash,
            files=corpus.files,
            skipped=corpus.skipped,
            section_count=len(corpus.sections),
            chunk_count=len(chunks),
            total_tokens=sum(s.token_count for s in corpus.sections),
            token_count=counter.info,
            normalization_version=NORMALIZATION_VERSION,
            reader_version=READER_VERSION,
            sparse_tokenizer=tokenizer.name,
            embedder=info,
            chunker=chunker,
            vector_count=len(keys),
            build=BuildStats(
                embedded_chunks=embedded,
                reused_chunks=len(chunks) - embedded if info else 0,
                embedded_sentences=sentences,
                seconds=round(time.perf_counter() - started, 3),
                parsed_files=len(corpus.parsed_files),
                reused_files=len(corpus.reused_files),
                removed_files=len(corpus.removed_files),
            ),
        )
        carry_over(index_dir, tmp, exclude=INDEX_ARTEFACTS)
        (tmp / MANIFEST_FILE).write_bytes(manifest_bytes(manifest))
    return manifest


def _mkdir(path: Path) -> Path:
    path.mkdir()
    return path


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
