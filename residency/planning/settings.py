"""How `residency plan` chooses beyond the host (`PlanSettings`): pydantic only, so the
command's `--help` is built from these fields without the plan's own models."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Strategy = Literal["planner", "frequency", "density", "random", "cag", "rag"]
MAX_PREFIXES = 64  # auto never tries more (each prefix is one more warm and one more probe)


class PlanSettings(BaseModel):
    """How `residency plan` chooses beyond the host: the strategy and the prefix count."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    strategy: Strategy = Field(
        default="planner",
        description="planner, or a baseline: frequency, density, random, cag, rag.",
    )
    prefixes: int | None = Field(
        default=None,
        ge=1,
        le=MAX_PREFIXES,
        description="Resident prefixes, each within the window, together within the KV cache "
        "minus --concurrency requests' own tokens; 1: one prefix (the plan before several); "
        "default: the count with the best expected coverage (--strategy planner).",
    )
    shared_tokens: int | None = Field(
        default=None,
        ge=0,
        description="Tokens of the shared head every prefix starts with (cached once; the "
        "sections worth seeing whichever prefix a question is routed to); 0: disjoint "
        "prefixes; default: two thirds of the window (dense models; hybrid: 0).",
    )
    seed: int = Field(default=0, description="Seed of the random baseline.")
