"""How sections are cut into chunks (`ChunkerSettings`, recorded in the index manifest), apart
from the chunkers (residency/corpus/chunking.py, numpy), so `residency index --help` declares
its flags without them."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

ChunkerKind = Literal["fixed", "semantic"]
DEFAULT_CHUNK_CHARS = 256
DEFAULT_CHUNK_OVERLAP = 32


class ChunkerSettings(BaseModel):
    """How sections were cut into chunks (recorded in the index manifest)."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    kind: ChunkerKind = Field(
        default="fixed",
        description="fixed (character windows) or semantic (embeds every sentence: slow).",
    )
    chunk_chars: int = Field(
        default=DEFAULT_CHUNK_CHARS,
        ge=16,
        le=100_000,
        description="Target chunk length in characters.",
    )
    chunk_overlap: int = Field(
        default=DEFAULT_CHUNK_OVERLAP,
        ge=0,
        le=50_000,
        description="Overlap of fixed chunks, characters.",
    )
    percentile: float = Field(
        default=25.0, ge=0.0, le=100.0, description="Semantic: cut below this similarity pct."
    )
    min_factor: float = Field(
        default=0.5, ge=0.0, le=1.0, description="Semantic: no cut before this x chunk_chars."
    )
    max_factor: float = Field(
        default=1.5, ge=1.0, le=10.0, description="Semantic: always cut at this x chunk_chars."
    )
    embedder: str | None = Field(
        default=None, max_length=4096, description="Semantic: the sentence embedder's name."
    )
