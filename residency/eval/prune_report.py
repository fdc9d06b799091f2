"""The pruner eval's report (`residency eval prune --json`): context removed and gold evidence kept
per way of choosing chunks, and the latency the pruner adds (the eval: residency/eval/prune.py)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from residency.eval.defaults import DEFAULT_PRUNE_K, DEFAULT_PRUNE_LIMIT
from residency.flags import Flag
from residency.machine import MachineInfo
from residency.stats import TimingStats


class KeptFigures(BaseModel):
    """Context removed and gold evidence kept by one way of choosing chunks."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    name: str = Field(max_length=64, description="pruner, floor only, or grades only.")
    chunks_retrieved: int = Field(ge=0, description="Chunks retrieved over all questions.")
    chunks_kept: int = Field(ge=0, description="Chunks kept over all questions.")
    removed_share: float = Field(ge=0, le=1, description="Share of retrieved chunks removed.")
    removed_chars_share: float = Field(
        ge=0, le=1, description="Share of retrieved characters removed."
    )
    gold_retrieved: int = Field(
        ge=0, description="Questions whose gold paragraph was among the retrieved chunks."
    )
    gold_kept: int = Field(ge=0, description="Of those, questions whose gold is still kept.")
    gold_kept_share: float | None = Field(
        ge=0, le=1, description="gold_kept / gold_retrieved (None when no gold was retrieved)."
    )


class PruneSample(BaseModel):
    """How many questions `eval prune` grades and how many chunks each (--max-questions,
    --chunks)."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    k: Annotated[int, Flag("--chunks")] = Field(
        default=DEFAULT_PRUNE_K, ge=1, le=100, description="Chunks retrieved per question."
    )
    limit: Annotated[int, Flag("--max-questions")] = Field(
        default=DEFAULT_PRUNE_LIMIT,
        ge=1,
        le=100_000,
        description="Questions to evaluate (spread evenly over the file).",
    )


class PruneEvalSettings(PruneSample):
    """What was measured, and against what (the pruner's flags are `PrunerSettings`)."""

    source: str = Field(max_length=4096, description="The questions' source file.")
    index_dir: str = Field(max_length=4096, description="The index chunks were retrieved from.")
    url: str = Field(max_length=2048, description="The pruner endpoint.")
    model: str = Field(max_length=512, description="The grading model.")
    threshold: int = Field(ge=1, le=5, description="Grade kept at or above.")
    keep_top_k: int = Field(ge=0, description="Chunks kept first in retrieval order regardless.")


class PruneEvalReport(BaseModel):
    """The pruner on N questions: context removed, gold evidence kept, latency, failures."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    settings: PruneEvalSettings = Field(description="What was measured.")
    machine: MachineInfo | None = Field(
        default=None, description="The machine that ran the eval (latency: the pruner's host)."
    )
    questions: int = Field(ge=0, description="Questions evaluated.")
    rows: tuple[KeptFigures, ...] = Field(
        max_length=8, description="pruner, floor only, grades only: same retrievals, same grades."
    )
    latency: TimingStats = Field(description="Seconds each pruner call added.")
    invalid_outputs: int = Field(ge=0, description="Calls whose reply was not schema-valid.")
    upstream_errors: int = Field(ge=0, description="Calls that got no usable HTTP reply.")
    first_error: str | None = Field(
        default=None, max_length=2000, description="The first failure's reason, if any."
    )
    notes: tuple[str, ...] = Field(default=(), max_length=32, description="Caveats.")
