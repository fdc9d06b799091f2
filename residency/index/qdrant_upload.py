"""`residency index --to qdrant`: upload a built index into its Qdrant collection, idempotently.

Each chunk becomes one point (`residency.retrieval.qdrant_schema`). Its dense vector comes from
the index's ``vectors.npy`` (`residency.index.qdrant_source`; nothing is re-embedded), its BM25
sparse vector from our tokenizer with the collection's avgdl. A point is written only when it
is new or its content hash changed; a point that lacks the named vector being uploaded gets just
that vector (backfill: the dual-write step of an embedding migration); chunks gone from the
index are deleted. Running it twice uploads nothing the second time. The collection's record is
updated last, so a router refuses a half-uploaded collection (its chunk set does not match yet)
instead of serving it.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from residency.errors import ConfigError
from residency.index.manifest import BuildProgress
from residency.index.options import DEFAULT_BATCH
from residency.index.qdrant_source import UploadChunk, UploadSource
from residency.retrieval.bm25_sparse import TERM_HASH, TermHasher, document_vector
from residency.retrieval.qdrant_schema import (
    PAYLOAD_FIELDS,
    RECORD_FORMAT,
    SPARSE_VECTOR,
    CollectionRecord,
    DenseVectorRecord,
    QdrantOptions,
    backend_errors,
    connect,
    point_id,
    read_record,
)

if TYPE_CHECKING:
    from qdrant_client import QdrantClient, models

INCOMPLETE = "0" * 64  # chunks_hash of a collection whose first upload has not finished
_T = TypeVar("_T")


class UploadReport(BaseModel):
    """What one upload did."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    location: str = Field(description="--to qdrant LOCATION.")
    collection: str = Field(description="Collection written.")
    vector_name: str = Field(description="Named dense vector written.")
    created_collection: bool = Field(description="The collection was created by this upload.")
    created_vector: bool = Field(description="The named vector was added by this upload.")
    chunks: int = Field(ge=0, description="Chunks in the index.")
    uploaded: int = Field(ge=0, description="Points written whole (new or changed content).")
    backfilled: int = Field(ge=0, description="Points that only got the named vector.")
    payload_updated: int = Field(ge=0, description="Points whose payload alone changed.")
    deleted: int = Field(ge=0, description="Points of chunks no longer in the index.")
    unchanged: int = Field(ge=0, description="Points already up to date.")
    avgdl_collection: float = Field(gt=0, description="BM25 avgdl the collection uses.")
    avgdl_index: float = Field(gt=0, description="avgdl of this index's chunks.")
    seconds: float = Field(ge=0, description="Wall time.")


def _check_existing(
    client: QdrantClient, collection: str, record: CollectionRecord, src: UploadSource, name: str
) -> bool:
    """Refuse a collection that means something else; True if ``name`` must be created."""
    if (record.sparse_tokenizer, record.normalization, record.term_hash) != (
        src.tokenizer.name,
        src.normalization,
        TERM_HASH,
    ) or (record.k1, record.b) != (src.k1, src.b):
        raise ConfigError(
            f"Qdrant collection {collection!r} holds BM25 terms of {record.sparse_tokenizer} / "
            f"{record.normalization} / {record.term_hash} (k1 {record.k1}, b {record.b}); index "
            f"{src.index_dir} has {src.tokenizer.name} / {src.normalization} / {TERM_HASH} "
            f"(k1 {src.k1}, b {src.b}): upload it into another --collection"
        )
    vectors = client.get_collection(collection).config.params.vectors
    sizes = {k: v.size for k, v in vectors.items()} if isinstance(vectors, dict) else {}
    held = record.vectors.get(name)
    if held is None:
        if name in sizes:
            raise ConfigError(
                f"Qdrant collection {collection!r} has a vector {name!r} that residency did not "
                "write: pick another --vector-name"
            )
        return True
    if (held.embedder, held.dim, sizes.get(name)) != (src.embedder, src.dim, src.dim):
        raise ConfigError(
            f"Qdrant collection {collection!r} vector {name!r} holds {held.embedder} "
            f"({held.dim}-d); index {src.index_dir} was built with {src.embedder} ({src.dim}-d): "
            "mixing them would silently lose recall; dual-write the new embedder into a new "
            "vector with --vector-name NAME (then `residency eval retrieval --retriever qdrant` "
            "before switching), or upload into another --collection"
        )
    return False


def _create(
    client: QdrantClient,
    collection: str,
    src: UploadSource,
    name: str,
    avgdl: float,
    options_is_server: bool,
) -> None:
    from qdrant_client import models

    record = _record(src, name, avgdl, INCOMPLETE, {})
    client.create_collection(
        collection,
        vectors_config={name: models.VectorParams(size=src.dim, distance=models.Distance.COSINE)},
        sparse_vectors_config={
            SPARSE_VECTOR: models.SparseVectorParams(modifier=models.Modifier.IDF)
        },
        metadata={"residency": record.model_dump(mode="json")},
    )
    # Embedded mode scans payloads and warns that indexes have no effect there: servers only.
    if options_is_server:
        client.create_payload_index(collection, "section_id", models.PayloadSchemaType.KEYWORD)
        client.create_payload_index(collection, "chunk_id", models.PayloadSchemaType.KEYWORD)
        client.create_payload_index(collection, "date", models.PayloadSchemaType.INTEGER)


def _add_vector(client: QdrantClient, collection: str, name: str, dim: int) -> None:
    from qdrant_client import models

    if not hasattr(client, "create_vector_name"):
        raise ConfigError(
            f"--vector-name {name}: adding a named vector to an existing collection needs "
            "qdrant-client and a Qdrant server >= 1.18: pip install 'qdrant-client>=1.18'"
        )
    client.create_vector_name(
        collection,
        name,
        models.DenseVectorNameConfig(
            dense=models.DenseVectorConfig(size=dim, distance=models.Distance.COSINE)
        ),
    )


def _record(
    src: UploadSource,
    name: str,
    avgdl: float,
    chunks: str,
    vectors: dict[str, DenseVectorRecord],
) -> CollectionRecord:
    mine = DenseVectorRecord(embedder=src.embedder, dim=src.dim, chunks_hash=chunks)
    return CollectionRecord(
        format_version=RECORD_FORMAT,
        sparse_tokenizer=src.tokenizer.name,
        normalization=src.normalization,
        term_hash=TERM_HASH,
        k1=src.k1,
        b=src.b,
        avgdl=avgdl,
        chunks_hash=chunks,
        corpus_hash=src.corpus_hash,
        index_dir=src.index_dir,
        updated_at=dt.datetime.now(dt.UTC),
        vectors={**vectors, name: mine},
    )


def _existing(client: QdrantClient, collection: str) -> dict[str, dict[str, Any]]:
    """Point id -> payload of every point (payload only: vectors are not read back)."""
    out: dict[str, dict[str, Any]] = {}
    offset: Any = None
    while True:
        points, offset = client.scroll(
            collection,
            limit=2048,
            offset=offset,
            with_payload=list(PAYLOAD_FIELDS),
            with_vectors=False,
        )
        out.update({str(p.id): dict(p.payload or {}) for p in points})
        if offset is None:
            return out


def _batches(items: Sequence[_T], size: int) -> Iterator[Sequence[_T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


@dataclass
class _Writes:
    """What an upload has to write, by kind."""

    full: list[UploadChunk] = field(default_factory=list)  # new or changed content
    backfill: list[tuple[UploadChunk, list[str]]] = field(default_factory=list)
    payload: list[tuple[UploadChunk, list[str]]] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)  # point ids no longer in the index


def _plan_writes(
    chunks: Sequence[UploadChunk], existing: dict[str, dict[str, Any]], vector_name: str
) -> _Writes:
    """Compare the index with the points already there (by content hash and payload)."""
    writes = _Writes()
    for c in chunks:
        old = existing.get(point_id(c.chunk_id))
        if old is None or old.get("content_hash") != c.content_hash:
            writes.full.append(c)
            continue
        have = [str(v) for v in old.get("vectors", [])]
        if vector_name not in have:
            writes.backfill.append((c, [*have, vector_name]))
        elif {k: old.get(k) for k in PAYLOAD_FIELDS} != {
            k: c.payload(have).get(k) for k in PAYLOAD_FIELDS
        }:
            writes.payload.append((c, have))
    wanted = {point_id(c.chunk_id) for c in chunks}
    writes.stale = [pid for pid in existing if pid not in wanted]
    return writes


def _point(src: UploadSource, c: UploadChunk, name: str, avgdl: float, hasher: TermHasher) -> Any:
    from qdrant_client import models

    sparse = document_vector(src.tokenizer.tokenize(c.index_text), avgdl, src.k1, src.b, hasher)
    return models.PointStruct(
        id=point_id(c.chunk_id),
        vector={
            name: src.vector_of(c.content_hash).tolist(),
            SPARSE_VECTOR: models.SparseVector(
                indices=list(sparse.indices), values=list(sparse.values)
            ),
        },
        payload=c.payload([name]),
    )


def _write(
    client: QdrantClient,
    collection: str,
    src: UploadSource,
    writes: _Writes,
    name: str,
    avgdl: float,
    batch_size: int,
    progress: BuildProgress | None,
) -> None:
    """Upsert, backfill, re-payload and delete, ``batch_size`` points per request."""
    from qdrant_client import models

    if progress is not None:
        progress.start(f"uploading to Qdrant {collection}", len(writes.full) + len(writes.backfill))
    hasher = TermHasher()
    for batch in _batches(writes.full, batch_size):
        points = [_point(src, c, name, avgdl, hasher) for c in batch]
        client.upsert(collection, points=points, wait=True)
        if progress is not None:
            progress.advance(len(batch))
    for pairs in _batches(writes.backfill, batch_size):
        vectors = [
            models.PointVectors(
                id=point_id(c.chunk_id), vector={name: src.vector_of(c.content_hash).tolist()}
            )
            for c, _ in pairs
        ]
        ops: list[Any] = [
            models.UpdateVectorsOperation(update_vectors=models.UpdateVectors(points=vectors))
        ]
        client.batch_update_points(collection, ops + [_set_payload(c, h) for c, h in pairs])
        if progress is not None:
            progress.advance(len(pairs))
    for pairs in _batches(writes.payload, batch_size):
        client.batch_update_points(collection, [_set_payload(c, h) for c, h in pairs])
    for ids in _batches(writes.stale, batch_size):
        client.delete(collection, points_selector=models.PointIdsList(points=list(ids)))


def upload(
    src: UploadSource,
    options: QdrantOptions,
    collection: str,
    vector_name: str,
    batch_size: int = DEFAULT_BATCH,
    progress: BuildProgress | None = None,
) -> UploadReport:
    """Bring ``collection`` up to date with ``src`` (see the module docstring)."""
    started = time.perf_counter()
    if batch_size <= 0:
        raise ConfigError(f"--batch-size {batch_size}: must be > 0")
    lengths = [len(src.tokenizer.tokenize(c.index_text)) for c in src.chunks]
    avgdl_index = sum(lengths) / len(lengths) if sum(lengths) else 1.0
    client = connect(options)
    try:
        with backend_errors(options):
            record = read_record(client, collection)
            new_vector = False
            if record is None:
                _create(client, collection, src, vector_name, avgdl_index, options.is_server)
                avgdl, vectors, existing = avgdl_index, {}, {}
            else:
                new_vector = _check_existing(client, collection, record, src, vector_name)
                if new_vector:
                    _add_vector(client, collection, vector_name, src.dim)
                avgdl, vectors = record.avgdl, dict(record.vectors)
                existing = _existing(client, collection)
            writes = _plan_writes(src.chunks, existing, vector_name)
            _write(client, collection, src, writes, vector_name, avgdl, batch_size, progress)
            done = _record(src, vector_name, avgdl, src.chunks_hash, vectors)
            client.update_collection(
                collection, metadata={"residency": done.model_dump(mode="json")}
            )
    finally:
        client.close()
    changed = len(writes.full) + len(writes.backfill) + len(writes.payload)
    return UploadReport(
        location=options.location,
        collection=collection,
        vector_name=vector_name,
        created_collection=record is None,
        created_vector=new_vector,
        chunks=len(src.chunks),
        uploaded=len(writes.full),
        backfilled=len(writes.backfill),
        payload_updated=len(writes.payload),
        deleted=len(writes.stale),
        unchanged=len(src.chunks) - changed,
        avgdl_collection=avgdl,
        avgdl_index=avgdl_index,
        seconds=round(time.perf_counter() - started, 3),
    )


def _set_payload(c: UploadChunk, have: Sequence[str]) -> models.SetPayloadOperation:
    from qdrant_client import models

    payload = c.payload(have)
    if c.date is None:
        payload["date"] = None  # a null removes the key (the chunk lost its date)
    return models.SetPayloadOperation(
        set_payload=models.SetPayload(payload=payload, points=[point_id(c.chunk_id)])
    )
