"""Option types shared by several commands, so each flag reads the same everywhere."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from residency.corpus.samples import DEFAULT_SAMPLE, SAMPLES

SAMPLE_HELP = (
    f"Built-in sample corpus used when no --index is given: {', '.join(SAMPLES)} (its English "
    "twin, for English-first models)."
)
SampleOption = Annotated[str, typer.Option("--sample", help=SAMPLE_HELP)]
DEFAULT_SAMPLE_NAME = DEFAULT_SAMPLE
JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON object.")]
PlanOption = Annotated[Path, typer.Option(help="plan.json from `residency plan`.")]
