"""What `residency bench` is asked to measure (`BenchOptions`), kept apart from the measuring
code so that the CLI can declare its flags without importing the HTTP client."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from residency.corpus.samples import JA_SAMPLE
from residency.flags import DEFAULT_VLLM_URL, Flag, VllmApiKey, VllmServer

DEFAULT_LENGTHS: tuple[int, ...] = (2000, 8000, 16000, 30000)
DEFAULT_REPEATS, DEFAULT_COLD_REPEATS = 5, 3

# Shared with `residency demo`, which derives its own when they are not given (None).
Lengths = Annotated[
    tuple[Annotated[int, Field(ge=1)], ...] | None,
    Flag(comma=True, show_default=False),
    Field(
        min_length=1,
        max_length=64,
        description="Prompt lengths in tokens, comma-separated (default: bench "
        f"{','.join(map(str, DEFAULT_LENGTHS))}; demo: those its measured prefill rate fits "
        "in --time-budget).",
    ),
]
Repeats = Annotated[
    int | None,
    Flag(show_default=False),
    Field(
        ge=1,
        le=1_000,
        description=f"Timed warm sends per length (default: bench {DEFAULT_REPEATS}, demo 3).",
    ),
]
ColdRepeats = Annotated[
    int | None,
    Flag(show_default=False),
    Field(
        ge=1,
        le=1_000,
        description="Cold sends per length, each with a fresh salt (default: bench "
        f"{DEFAULT_COLD_REPEATS}, demo 2).",
    ),
]


class BenchOptions(BaseModel):
    """What `residency bench` measures and how it talks to the server."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    server: VllmServer = None
    model: Annotated[str | None, Flag("--served-model")] = Field(
        default=None,
        max_length=4096,
        description="Served model (default: the server's only one).",
    )
    lengths: Lengths = None
    repeats: Repeats = None
    cold_repeats: ColdRepeats = None
    max_sightings: int = Field(
        default=4, ge=0, le=64, description="Untimed re-sends of the warm prompt until one hits."
    )
    request_timeout_s: float = Field(
        default=600.0, gt=0, le=86_400, description="Seconds one send may take."
    )
    api_key: VllmApiKey = None
    text_dir: Path = Field(
        default=JA_SAMPLE.docs, description="Corpus whose text fills the prompts (no --plan)."
    )

    @property
    def url(self) -> str:
        """The server's base URL: --server, or where `vllm serve` listens by default."""
        return self.server or DEFAULT_VLLM_URL

    @property
    def prompt_lengths(self) -> tuple[int, ...]:
        """--lengths, or the default ladder."""
        return self.lengths or DEFAULT_LENGTHS

    @property
    def warm_sends(self) -> int:
        """--repeats, or its default."""
        return self.repeats or DEFAULT_REPEATS

    @property
    def cold_sends(self) -> int:
        """--cold-repeats, or its default."""
        return self.cold_repeats or DEFAULT_COLD_REPEATS
