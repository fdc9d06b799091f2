"""What `residency eval retrieval` is asked (`RetrievalEvalOptions`): where the retrievers run,
the fusion weights and the history file. Pydantic only, so the command declares its flags from
these fields without importing the report models, numpy or the index."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from residency.eval.defaults import HISTORY_FILE
from residency.flags import Flag

RetrievalBackendName = Literal["hybrid", "qdrant"]


class RetrievalEvalOptions(BaseModel):
    """Where `eval retrieval` runs the retrievers, how it fuses them, where it records the run."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    retriever: RetrievalBackendName = Field(
        default="hybrid",
        description="hybrid: the index's own BM25, dense and fusion (in process); qdrant: the "
        "same three through the index's Qdrant collection (--qdrant).",
    )
    weights: Annotated[dict[str, Annotated[float, Field(ge=0)]] | None, Flag("--weight")] = Field(
        default=None,
        min_length=1,
        max_length=16,
        description="Fusion weight NAME=W (repeatable), e.g. dense=0.3 bm25=0.7; the others keep "
        "their defaults.",
    )
    history: Path | None = Field(
        default=None,
        description=f"Eval history to append to (default: INDEX/{HISTORY_FILE}).",
    )
