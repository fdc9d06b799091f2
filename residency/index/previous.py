"""The previous build in an index directory, read back for reuse without holding it: where each
file's sections sit in its sections.jsonl (they are contiguous: corpus order), the semantic
chunk spans of unchanged sections, and its vectors by content hash, read row by row from disk.

Reading the old index while the new one is built is safe: the new one is swapped in only at the
end (`residency.atomic`). Anything unreadable in it means no reuse (everything is read and
embedded again), never a failed build.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from numpy.typing import NDArray
from pydantic import ValidationError

from residency.corpus.chunker_settings import ChunkerSettings
from residency.corpus.loader import PreviousCorpus
from residency.corpus.model import Chunk, Section, SkippedInput
from residency.corpus.sentences import Span
from residency.errors import ConfigError
from residency.index.manifest import (
    CHUNKS_FILE,
    SECTIONS_FILE,
    VECTOR_KEYS_FILE,
    VECTORS_FILE,
    IndexManifest,
    read_manifest,
)
from residency.normalize import NORMALIZATION_VERSION
from residency.retrieval import Embedder
from residency.retrieval.stored import npy_data_offset


def _line_offsets(path: Path) -> Iterator[tuple[int, bytes]]:
    """(byte offset, line without its newline) of every non-empty line of a file."""
    offset = 0
    with path.open("rb") as f:
        for line in f:
            if line.strip():
                yield offset, line.rstrip(b"\n")
            offset += len(line)


def _read_range(path: Path, start: int, end: int) -> list[bytes]:
    with path.open("rb") as f:
        f.seek(start)
        return [line for line in f.read(end - start).splitlines() if line.strip()]


def read_rows(path: Path, offset: int, dim: int, rows: Sequence[int]) -> NDArray[np.float32]:
    """Rows of the float32 (n, dim) matrix stored at `offset` in `path`, read run by run of
    consecutive rows (no memory map: mapped pages would count as the process's memory)."""
    out = np.empty((len(rows), dim), dtype=np.float32)
    row_bytes = dim * 4
    with path.open("rb") as f:
        i = 0
        while i < len(rows):
            j = i + 1
            while j < len(rows) and rows[j] == rows[j - 1] + 1:
                j += 1
            f.seek(offset + rows[i] * row_bytes)
            block = np.fromfile(f, dtype=np.float32, count=(j - i) * dim)
            if block.size != (j - i) * dim:
                raise ValueError(f"{path}: rows {rows[i]}..{rows[j - 1]} lie past its end")
            out[i:j] = block.reshape(j - i, dim)
            i = j
    return out


@dataclass(frozen=True, slots=True)
class OldVectors:
    """The previous build's vectors: content hash -> row, rows read from vectors.npy."""

    rows: dict[str, int]
    path: Path
    offset: int
    dim: int

    def read(self, rows: Sequence[int]) -> NDArray[np.float32]:
        """These rows, in this order."""
        return read_rows(self.path, self.offset, self.dim, rows)


@dataclass(slots=True)
class PreviousBuild:
    """A readable previous build: its manifest and where its sections and chunks sit."""

    directory: Path
    manifest: IndexManifest
    file_ranges: dict[str, tuple[int, int]]  # file -> [start, end) bytes in sections.jsonl
    _texts: dict[str, bytes] | None = field(default=None)  # section id -> hash of its text
    _chunk_ranges: dict[str, tuple[int, int]] | None = field(default=None)  # in chunks.jsonl

    @classmethod
    def open(cls, directory: Path) -> PreviousBuild | None:
        """The build in `directory`, or None when there is none or it cannot be trusted (every
        line of its sections.jsonl is validated once, as opening it would)."""
        try:
            manifest = read_manifest(directory)
            ranges: dict[str, tuple[int, int]] = {}
            last = ""
            for offset, line in _line_offsets(directory / SECTIONS_FILE):
                rel = Section.model_validate_json(line).file
                end = offset + len(line) + 1
                if rel != last and rel in ranges:
                    return None  # not in corpus order: not written by this program
                ranges[rel] = (ranges[rel][0] if rel in ranges else offset, end)
                last = rel
        except (ConfigError, OSError, ValidationError):
            return None
        return cls(directory, manifest, ranges)

    def sections_of(self, rel: str) -> Iterator[Section]:
        """The previous build's sections of one file, in order."""
        if rel not in self.file_ranges:
            return
        start, end = self.file_ranges[rel]
        for line in _read_range(self.directory / SECTIONS_FILE, start, end):
            yield Section.model_validate_json(line)

    def corpus(self) -> PreviousCorpus:
        """What the loader needs to take unchanged files from this build."""
        old = self.manifest
        skipped: dict[str, list[SkippedInput]] = {}
        for item in old.skipped:
            skipped.setdefault(item.file, []).append(item)
        files = {f.path: f.sha256 for f in old.files}
        return PreviousCorpus(old.reader_version, old.token_count, files, self.sections_of, skipped)

    def known_spans(
        self, sections: Sequence[Section], chunker: ChunkerSettings
    ) -> dict[str, list[Span]]:
        """Chunk spans of those `sections` whose text is unchanged since this build, when it
        used the same chunker settings (a semantic re-index then embeds no sentence of them)."""
        if self.manifest.chunker != chunker or chunker.kind != "semantic":
            return {}
        try:
            texts, chunk_ranges = self._span_index()
        except (ConfigError, OSError, ValidationError):
            return {}
        spans: dict[str, list[Span]] = {}
        for section in sections:
            if section.id not in chunk_ranges or texts.get(section.id) != _digest(section.text):
                continue
            start, end = chunk_ranges[section.id]
            for line in _read_range(self.directory / CHUNKS_FILE, start, end):
                chunk = Chunk.model_validate_json(line)
                spans.setdefault(section.id, []).append(Span(chunk.start_char, chunk.end_char))
        return spans

    def _span_index(self) -> tuple[dict[str, bytes], dict[str, tuple[int, int]]]:
        """(section id -> hash of its text, section id -> its chunks' byte range), built once."""
        if self._texts is None or self._chunk_ranges is None:
            texts: dict[str, bytes] = {}
            for _, line in _line_offsets(self.directory / SECTIONS_FILE):
                s = Section.model_validate_json(line)
                texts[s.id] = _digest(s.text)
            ranges: dict[str, tuple[int, int]] = {}
            for offset, line in _line_offsets(self.directory / CHUNKS_FILE):
                sid = Chunk.model_validate_json(line).section_id
                end = offset + len(line) + 1
                ranges[sid] = (ranges[sid][0] if sid in ranges else offset, end)
            self._texts, self._chunk_ranges = texts, ranges
        return self._texts, self._chunk_ranges

    def vectors(self, embedder: Embedder) -> OldVectors | None:
        """This build's vectors when they are compatible with `embedder`, else None."""
        old = self.manifest
        if (
            old.embedder is None
            or old.embedder.name != embedder.name
            or old.embedder.dim != embedder.dim
            or old.normalization_version != NORMALIZATION_VERSION
        ):
            return None
        try:
            keys: Any = orjson.loads((self.directory / VECTOR_KEYS_FILE).read_bytes())
            offset, shape, dtype = npy_data_offset(self.directory / VECTORS_FILE)
        except (OSError, ValueError):
            return None  # no usable vectors: embed everything
        if not isinstance(keys, list) or shape != (len(keys), embedder.dim) or dtype != np.float32:
            return None
        size = (self.directory / VECTORS_FILE).stat().st_size
        if size < offset + len(keys) * embedder.dim * 4:
            return None
        rows = {str(k): i for i, k in enumerate(keys)}
        return OldVectors(rows, self.directory / VECTORS_FILE, offset, embedder.dim)


def _digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).digest()
