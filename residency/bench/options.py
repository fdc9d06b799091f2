"""What `residency bench` is asked to measure (`BenchOptions`), kept apart from the measuring
code so that the CLI can declare its flags without importing the HTTP client."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from residency.corpus.samples import JA_SAMPLE
from residency.flags import Flag

DEFAULT_LENGTHS: tuple[int, ...] = (2000, 8000, 16000, 30000)


class BenchOptions(BaseModel):
    """What `residency bench` measures and how it talks to the server."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    server: str = Field(
        min_length=1, max_length=4096, description="Base URL of the vLLM server to measure."
    )
    model: str | None = Field(
        default=None,
        max_length=4096,
        description="Served model (default: the server's only one).",
    )
    lengths: Annotated[tuple[Annotated[int, Field(ge=1)], ...], Flag(comma=True)] = Field(
        default=DEFAULT_LENGTHS,
        min_length=1,
        max_length=64,
        description="Prompt lengths in tokens, comma-separated.",
    )
    repeats: int = Field(default=5, ge=1, le=1_000, description="Timed warm sends per length.")
    cold_repeats: int = Field(
        default=3, ge=1, le=1_000, description="Cold sends per length, each with a fresh salt."
    )
    max_sightings: int = Field(
        default=4, ge=0, le=64, description="Untimed re-sends of the warm prompt until one hits."
    )
    request_timeout_s: float = Field(
        default=600.0, gt=0, le=86_400, description="Seconds one send may take."
    )
    api_key: Annotated[str | None, Flag(envvar="VLLM_API_KEY")] = Field(
        default=None, max_length=4096, description="Bearer token (vLLM --api-key)."
    )
    text_dir: Path = Field(
        default=JA_SAMPLE.docs, description="Corpus whose text fills the prompts (no --plan)."
    )
