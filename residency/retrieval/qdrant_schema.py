"""The Qdrant collection residency writes and reads: names, payload, metadata, connection.

One collection per index. Each point is one chunk (id: uuid5 of the chunk id) with a sparse
vector ``bm25`` (our own tokens, `residency.retrieval.bm25_sparse`, IDF applied by the server)
and one or more named dense vectors (``dense`` by default; a second name, e.g. ``dense-ruri``,
is how an embedding migration dual-writes). Payload: ``chunk_id``, ``section_id`` (keyword
index), ``date`` (integer YYYYMMDD, integer index: range filters), ``content_hash``, ``order``
(corpus order: the tie-break bm25s and FAISS use) and ``vectors`` (the dense names written, so
an upload can tell what is missing without reading vectors back).

The collection's metadata (``residency`` key) records what its vectors mean: tokenizer,
normalisation, term hash, BM25 k1 / b / avgdl, and per dense vector the embedder and dimension.
Both the upload and the query side refuse a collection whose record differs from the index
manifest: a query embedded by another model, or tokenised another way, silently loses recall.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import re
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from residency.errors import BackendError, ConfigError
from residency.flags import Flag, Section

if TYPE_CHECKING:
    from qdrant_client import QdrantClient

QDRANT_INSTALL = "pip install 'residency[qdrant]'"
SPARSE_VECTOR = "bm25"
DEFAULT_DENSE_VECTOR = "dense"
METADATA_KEY = "residency"
RECORD_FORMAT: Literal[1] = 1
# Point ids are uuid5(namespace, chunk id): stable across uploads and routers.
POINT_NAMESPACE = uuid.UUID("6f1c3a52-5d0e-4c8e-9a43-7d1f0b2e8c11")
PAYLOAD_FIELDS = ("chunk_id", "section_id", "content_hash", "order", "date", "vectors")
_NAME = re.compile(r"[A-Za-z0-9_-]{1,255}")

Fusion = Literal["rrf", "qdrant-rrf"]


class QdrantCollectionRef(BaseModel):
    """Which collection, and the key to reach it (the part of `QdrantOptions` an upload names
    beside its own location)."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    collection: str | None = Field(
        default=None,
        max_length=255,
        description="--collection: the collection's name (default: the index directory's).",
    )
    api_key: str | None = Field(
        default=None, description="--qdrant-api-key: the Qdrant server's API key."
    )


class QdrantOptions(QdrantCollectionRef):
    """Where the collection lives and how to query it (--qdrant, --collection, ...)."""

    location: str = Field(
        min_length=1,
        max_length=4096,
        description="--qdrant: where the collection is: a Qdrant server's URL "
        "(http://host:6333), a local directory (qdrant-client's embedded mode, one process at a "
        "time) or ':memory:'.",
    )
    fusion: Fusion = Field(
        default="rrf",
        description="--qdrant-fusion: who fuses the two paths: rrf, residency's weighted RRF "
        "(the same ranking as in process), or qdrant-rrf, the server (its formula differs).",
    )
    prefetch: int = Field(default=40, ge=1, le=1000, description="Candidates per path.")
    timeout_s: int = Field(default=30, ge=1, le=3600, description="Request timeout (seconds).")

    @property
    def is_server(self) -> bool:
        """True for an http(s) URL, False for embedded (local) mode."""
        return self.location.startswith(("http://", "https://"))


# QdrantOptions as options: --qdrant (the location: the whole model is absent without it),
# --collection, --qdrant-api-key ($QDRANT_API_KEY), --qdrant-fusion.
QDRANT_SECTION = Section(
    panel="Qdrant (--retriever qdrant)",
    flags={
        "location": Flag("--qdrant"),
        "collection": Flag("--collection"),
        "api_key": Flag("--qdrant-api-key", envvar="QDRANT_API_KEY"),
        "fusion": Flag("--qdrant-fusion"),
    },
    skip=frozenset({"prefetch", "timeout_s"}),
)


class DenseVectorRecord(BaseModel):
    """What one named dense vector of the collection holds."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    embedder: str = Field(min_length=1, max_length=4096, description="get_embedder() name.")
    dim: int = Field(ge=1, le=65_536, description="Vector dimension.")
    chunks_hash: str = Field(
        min_length=64, max_length=64, description="chunks_hash of the last upload of it."
    )


class CollectionRecord(BaseModel):
    """The collection metadata under ``residency``: how its vectors were made."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    format_version: Literal[1] = Field(description="Layout version of this record.")
    sparse_tokenizer: str = Field(min_length=1, max_length=128, description="BM25 tokenizer.")
    normalization: str = Field(min_length=1, max_length=64, description="normalize version.")
    term_hash: str = Field(min_length=1, max_length=64, description="Sparse index scheme.")
    k1: float = Field(gt=0, description="BM25 term-frequency saturation.")
    b: float = Field(ge=0, le=1, description="BM25 length normalisation.")
    avgdl: float = Field(gt=0, description="Mean document length, fixed at creation.")
    chunks_hash: str = Field(min_length=64, max_length=64, description="Last uploaded chunks.")
    corpus_hash: str = Field(min_length=64, max_length=64, description="Its index's corpus.")
    index_dir: str = Field(min_length=1, max_length=4096, description="Last uploaded index.")
    updated_at: dt.datetime = Field(description="When the last upload finished (UTC).")
    vectors: dict[str, DenseVectorRecord] = Field(description="Named dense vectors.")


def point_id(chunk_id: str) -> str:
    """The point id of a chunk: uuid5 of its id (Qdrant ids are uuids or integers)."""
    return str(uuid.uuid5(POINT_NAMESPACE, chunk_id))


def date_value(day: dt.date) -> int:
    """A date as the integer payload value: 2025-01-03 -> 20250103 (ordered like the date)."""
    return day.year * 10_000 + day.month * 100 + day.day


def chunks_hash(rows: Sequence[tuple[str, str, str, dt.date | None]]) -> str:
    """sha256 over (chunk id, section id, content hash, date) rows, in order: one chunk set."""
    digest = hashlib.sha256()
    for chunk_id, section_id, content, day in rows:
        digest.update(f"{chunk_id}\t{section_id}\t{content}\t{day or ''}\n".encode())
    return digest.hexdigest()


def check_name(name: str, flag: str) -> str:
    """A collection or vector name Qdrant and URLs accept (letters, digits, _ and -)."""
    if not _NAME.fullmatch(name):
        raise ConfigError(
            f"{flag} {name!r}: use 1-255 letters, digits, '_' or '-' (it goes into URLs)"
        )
    return name


def default_collection(index_dir: Path) -> str:
    """The collection of an index by default: its directory name, other characters as '-'."""
    return re.sub(r"[^A-Za-z0-9_-]", "-", index_dir.resolve().name)[:255] or "residency"


def connect(options: QdrantOptions) -> QdrantClient:
    """A client for ``options.location``; BackendError if a local path is locked."""
    try:
        from qdrant_client import QdrantClient
    except ImportError as exc:
        raise ConfigError(
            f"--qdrant needs qdrant-client; install it with: {QDRANT_INSTALL}"
        ) from exc
    if options.is_server:
        # No background version probe: it warns from a thread when the server is down, and a
        # failing call already says what failed (`backend_errors`).
        return QdrantClient(
            url=options.location,
            api_key=options.api_key,
            timeout=options.timeout_s,
            check_compatibility=False,
        )
    if options.location == ":memory:":
        return QdrantClient(location=":memory:")
    try:
        return QdrantClient(path=options.location)
    except RuntimeError as exc:  # portalocker: another process holds the directory
        raise BackendError(
            f"--qdrant {options.location}: the local collection directory is in use by another "
            f"process ({exc}); embedded mode allows one process at a time: run a Qdrant server "
            "for several routers"
        ) from None


def read_record(client: QdrantClient, collection: str) -> CollectionRecord | None:
    """The collection's residency record; None if it does not exist; ConfigError if not ours."""
    if not client.collection_exists(collection):
        return None
    metadata: dict[str, Any] | None = client.get_collection(collection).config.metadata
    raw = (metadata or {}).get(METADATA_KEY)
    if raw is None:
        raise ConfigError(
            f"Qdrant collection {collection!r} exists but was not written by `residency index "
            "--to qdrant` (no residency metadata): pick another --collection"
        )
    try:
        return CollectionRecord.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise ConfigError(
            f"Qdrant collection {collection!r}: residency metadata "
            f"{'.'.join(map(str, err['loc']))}: {err['msg']}; re-upload into a new --collection"
        ) from None


@contextlib.contextmanager
def backend_errors(options: QdrantOptions) -> Iterator[None]:
    """Client calls inside: a server that cannot be reached or refuses becomes a BackendError."""
    from qdrant_client.http.exceptions import ResponseHandlingException, UnexpectedResponse

    try:
        yield
    except UnexpectedResponse as exc:
        body = exc.content[:300].decode("utf-8", "replace")
        raise BackendError(
            f"--qdrant {options.location}: the server answered HTTP {exc.status_code} ({body})"
        ) from None
    except (ResponseHandlingException, ConnectionError) as exc:
        raise BackendError(
            f"--qdrant {options.location}: cannot reach the Qdrant server "
            f"({type(exc).__name__}: {str(exc)[:200]}); is it running, and is the URL right?"
        ) from None
