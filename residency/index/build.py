"""Building an index directory in bounded memory, swapped in atomically when done.

`build_index` works inside a temp dir beside the target (`residency.atomic`): an interrupted
build leaves the old index as it was. Nothing holds the whole corpus; three passes stream from
file to file:

1. corpus files -> ``sections.jsonl`` (`CorpusStream`: files read one at a time, .txt / .jsonl
   line by line, token counts in batches);
2. ``sections.jsonl`` -> ``chunks.jsonl`` in batches of sections, each chunk's text fed to the
   BM25 writer (`Bm25Writer`: postings spilled to disk, the CSC matrix written column block by
   column block) and its id to a spill file the metadata files are written from;
3. with dense vectors: ``chunks.jsonl`` -> ``vectors.npy``, one row per distinct chunk content
   hash, reused from the previous build (read row by row) or embedded `EMBED_BATCH` at a time,
   then -> ``dense.faiss`` (`DenseWriter`) batch by batch.

What stays in memory grows with the number of sections and chunks, not with their text: section
ids (duplicates are refused by id), the BM25 vocabulary, a few numbers per chunk, and with dense
vectors each chunk's content hash. The files are those the former in-memory build wrote, byte for
byte (tests/test_index_streaming.py). An HNSW index (over `DEFAULT_HNSW_THRESHOLD` chunks) is
the exception: FAISS holds its graph and every vector while it is built.
"""

from __future__ import annotations

import datetime as dt
import shutil
import time
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import orjson
from numpy.typing import NDArray
from pydantic import BaseModel

from residency.atomic import atomic_directory, carry_over
from residency.corpus.chunker_settings import ChunkerSettings
from residency.corpus.chunking import (
    check_chunker_settings,
    chunk_sections,
    count_sentences_to_embed,
)
from residency.corpus.formats import READER_VERSION
from residency.corpus.loader import SECTION_BATCH, CorpusStream
from residency.corpus.model import Section
from residency.corpus.sentences import Span
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
    manifest_bytes,
)
from residency.index.options import IndexOptions
from residency.index.previous import OldVectors, PreviousBuild, read_rows
from residency.normalize import NORMALIZATION_VERSION
from residency.retrieval import Embedder, Tokenizer, get_embedder, get_tokenizer
from residency.retrieval.bm25_build import Bm25Writer
from residency.retrieval.dense_build import DenseWriter
from residency.retrieval.stored import npy_header
from residency.tokenizer import ModelTokenizer

SPILL_DIR = ".spill"  # inside the temp build dir, removed before the swap
IDS_FILE = "chunk-ids.jsonl"
EMBED_BATCH = 256  # chunk texts handed to the embedder at once
DENSE_BATCH = 4096  # vectors read back and added to the FAISS file at once


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


def _batched(items: Iterator[Section], size: int) -> Iterator[list[Section]]:
    batch: list[Section] = []
    for item in items:
        batch.append(item)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


def _read_sections(path: Path) -> Iterator[Section]:
    with path.open("rb") as f:
        for line in f:
            yield Section.model_validate_json(line)


def _json_line(record: BaseModel) -> bytes:
    return orjson.dumps(record.model_dump(mode="json")) + b"\n"


@dataclass(frozen=True, slots=True)
class _Plan:
    """What a build is asked to do, resolved: the chunker, the embedder, the previous build."""

    chunker: ChunkerSettings
    embedder: Embedder | None
    dense: bool
    tokenizer: Tokenizer
    previous: PreviousBuild | None
    progress: BuildProgress | None

    def known(self, sections: list[Section]) -> dict[str, list[Span]]:
        """Chunk spans the previous build cut in those sections, where still valid."""
        if self.previous is None or self.embedder is None:
            return {}
        return self.previous.known_spans(sections, self.chunker)


@dataclass(slots=True)
class _Chunked:
    """What the chunk pass leaves for the dense pass and the manifest."""

    count: int = 0
    embedded: int = 0  # chunks whose content hash the previous build has no vector for
    # With dense vectors: content hash -> vector row (first occurrence order), each chunk's row.
    keys: dict[str, int] = field(default_factory=dict)
    rows: array[int] = field(default_factory=lambda: array("i"))


def _write_sections(stream: CorpusStream, path: Path, plan: _Plan) -> tuple[int, int]:
    """Pass 1: the corpus's sections to sections.jsonl; (total tokens, sentences the semantic
    chunker will embed)."""
    tokens = sentences = 0
    with path.open("wb") as out:
        for batch in _batched(iter(stream), SECTION_BATCH):
            out.write(b"".join(_json_line(s) for s in batch))
            tokens += sum(s.token_count for s in batch)
            if plan.chunker.kind == "semantic":
                sentences += count_sentences_to_embed(batch, plan.chunker, plan.known(batch))
    return tokens, sentences


def _write_chunks(
    tmp: Path, spill: Path, plan: _Plan, old: OldVectors | None, sentences: int
) -> _Chunked:
    """Pass 2: sections.jsonl to chunks.jsonl, the BM25 files and the chunk ids."""
    progress = plan.progress
    if progress is not None and sentences:
        progress.start("embedding sentences (semantic chunker)", sentences)
    bm25 = Bm25Writer(plan.tokenizer, spill)
    done = _Chunked()
    with (tmp / CHUNKS_FILE).open("wb") as out, (spill / IDS_FILE).open("wb") as ids:
        for batch in _batched(_read_sections(tmp / SECTIONS_FILE), SECTION_BATCH):
            chunks = chunk_sections(
                batch,
                plan.chunker,
                plan.embedder,
                progress.advance if progress else None,
                plan.known(batch),
                first_order=done.count,
            )
            for c in chunks:
                out.write(_json_line(c))
                ids.write(orjson.dumps(c.id) + b"\n")
                bm25.add(c.index_text)
                if plan.dense:
                    done.rows.append(done.keys.setdefault(c.content_hash, len(done.keys)))
                    done.embedded += old is None or c.content_hash not in old.rows
            done.count += len(chunks)
    (tmp / BM25_DIR).mkdir()
    bm25.write(tmp / BM25_DIR, spill / IDS_FILE)
    return done


def _vector_rows(
    batch: list[tuple[str, str]], embedder: Embedder, old: OldVectors | None, plan: _Plan
) -> NDArray[np.float32]:
    """The vectors of (content hash, text) pairs: the old build's row, else embedded now."""
    out = np.empty((len(batch), embedder.dim), dtype=np.float32)
    fresh = [i for i, (key, _) in enumerate(batch) if old is None or key not in old.rows]
    if fresh:
        advance = plan.progress.advance if plan.progress else None
        out[fresh] = embedder.embed_passages([batch[i][1] for i in fresh], advance)
    if old is not None and len(fresh) < len(batch):
        reused = [i for i, (key, _) in enumerate(batch) if key in old.rows]
        out[reused] = old.read([old.rows[batch[i][0]] for i in reused])
    return out


def _write_dense(
    tmp: Path, spill: Path, plan: _Plan, embedder: Embedder, old: OldVectors | None, done: _Chunked
) -> None:
    """Pass 3: vectors.npy (one row per distinct chunk text), vector_keys.json, dense/."""
    keys, dim = done.keys, embedder.dim
    if plan.progress is not None:
        todo = len(keys) if old is None else sum(1 for k in keys if k not in old.rows)
        plan.progress.start("embedding chunks", todo)
    header = npy_header(np.dtype(np.float32), (len(keys), dim))
    with (tmp / VECTORS_FILE).open("wb") as out, (tmp / CHUNKS_FILE).open("rb") as chunks:
        out.write(header)
        next_row, batch = 0, list[tuple[str, str]]()
        for line in chunks:
            record = orjson.loads(line)
            if keys[record["content_hash"]] != next_row:
                continue  # the same text as an earlier chunk: its row is written
            next_row += 1
            batch.append((record["content_hash"], record["index_text"]))
            if len(batch) >= EMBED_BATCH:
                _vector_rows(batch, embedder, old, plan).tofile(out)
                batch = []
        if batch:
            _vector_rows(batch, embedder, old, plan).tofile(out)
    # One dumps of the list: every small orjson.dumps result holds ~4 KiB until freed.
    (tmp / VECTOR_KEYS_FILE).write_bytes(orjson.dumps(list(keys)))
    (tmp / DENSE_DIR).mkdir()
    writer = DenseWriter(tmp / DENSE_DIR, embedder, done.count)
    try:
        rows = np.frombuffer(done.rows, dtype=np.int32)
        for start in range(0, len(rows), DENSE_BATCH):
            part = rows[start : start + DENSE_BATCH].tolist()
            writer.add(read_rows(tmp / VECTORS_FILE, len(header), dim, part))
        writer.write(spill / IDS_FILE)
    finally:
        writer.close()


def build_index(
    corpus_dir: Path,
    index_dir: Path,
    options: IndexOptions,
    counter: ModelTokenizer,
    progress: BuildProgress | None = None,
    embedder: Embedder | None = None,
) -> IndexManifest:
    """Load, chunk, embed and index `corpus_dir` into `index_dir`, swapped in atomically.
    `embedder`: the one to use instead of building ``options.embedder`` (same name)."""
    started = time.perf_counter()
    corpus_dir, index_dir = corpus_dir.resolve(), index_dir.resolve()
    chunker = _chunker(options)
    _check_target(corpus_dir, index_dir)
    if embedder is not None and embedder.name != options.embedder:
        raise ConfigError(f"embedder {embedder.name!r} given for --embedder {options.embedder!r}")
    tokenizer = get_tokenizer(options.sparse_tokenizer)
    previous = PreviousBuild.open(index_dir)
    if options.dense or chunker.kind == "semantic":
        embedder = embedder or get_embedder(options.embedder)
    else:
        embedder = None
    plan = _Plan(chunker, embedder, options.dense, tokenizer, previous, progress)
    stream = CorpusStream(corpus_dir, counter, previous.corpus() if previous else None, progress)
    with atomic_directory(index_dir) as tmp:
        spill = tmp / SPILL_DIR
        spill.mkdir()
        total_tokens, sentences = _write_sections(stream, tmp / SECTIONS_FILE, plan)
        if options.strict:
            _refuse_skipped(stream)
        old = previous.vectors(embedder) if previous and embedder and options.dense else None
        done = _write_chunks(tmp, spill, plan, old, sentences)
        info = None
        if options.dense and embedder is not None:
            _write_dense(tmp, spill, plan, embedder, old, done)
            info = EmbedderInfo(name=embedder.name, dim=embedder.dim)
        shutil.rmtree(spill)
        manifest = IndexManifest(
            format_version=INDEX_FORMAT_VERSION,
            created_at=dt.datetime.now(dt.UTC),
            corpus_dir=str(corpus_dir),
            corpus_hash=stream.corpus_hash(),
            files=tuple(stream.files),
            skipped=tuple(stream.skipped),
            section_count=stream.section_count,
            chunk_count=done.count,
            total_tokens=total_tokens,
            token_count=counter.info,
            normalization_version=NORMALIZATION_VERSION,
            reader_version=READER_VERSION,
            sparse_tokenizer=tokenizer.name,
            embedder=info,
            chunker=chunker,
            vector_count=len(done.keys) if info else 0,
            build=_build_stats(stream, done, sentences, started, dense=info is not None),
        )
        carry_over(index_dir, tmp, exclude=INDEX_ARTEFACTS)
        (tmp / MANIFEST_FILE).write_bytes(manifest_bytes(manifest))
    return manifest


def _chunker(options: IndexOptions) -> ChunkerSettings:
    """The chunker settings, checked (a semantic chunker embeds with --embedder)."""
    chunker = options.chunker
    if chunker.kind == "semantic":
        chunker = chunker.model_copy(update={"embedder": options.embedder})
    check_chunker_settings(chunker)
    return chunker


def _refuse_skipped(stream: CorpusStream) -> None:
    """--strict: a `CorpusError` naming the first inputs the corpus would skip, if any."""
    if stream.skipped:
        listed = "; ".join(f"{s.location()}: {s.reason}" for s in stream.skipped[:5])
        raise CorpusError(
            f"--strict: {len(stream.skipped)} input(s) would be skipped ({listed}"
            f"{'; ...' if len(stream.skipped) > 5 else ''}); nothing written"
        )


def _build_stats(
    stream: CorpusStream, done: _Chunked, sentences: int, started: float, *, dense: bool
) -> BuildStats:
    """What the build embedded, reused and parsed, and how long it took."""
    return BuildStats(
        embedded_chunks=done.embedded if dense else 0,
        reused_chunks=done.count - done.embedded if dense else 0,
        embedded_sentences=sentences,
        seconds=round(time.perf_counter() - started, 3),
        parsed_files=len(stream.parsed_files),
        reused_files=len(stream.reused_files),
        removed_files=len(stream.removed_files()),
    )
