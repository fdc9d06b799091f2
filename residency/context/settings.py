"""The pipeline's knobs (`ContextSettings`): how a question is routed, which retriever ranks
the corpus, and the optional pruner. `residency serve` derives one from its flags
(`ServeSettings.context`); the evaluations, the demo and the tests build one directly."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from residency.context.pruner_settings import PrunerSettings
from residency.context.routing import RoutingSettings

RetrieverName = Literal["hybrid", "bm25", "dense", "qdrant"]
DEFAULT_RETRIEVER: RetrieverName = "hybrid"
RETRIEVER_HELP = (
    "hybrid (dense + BM25, fused), bm25, dense (in process), or qdrant (the same fusion over "
    "the index's Qdrant collection, see --qdrant)."
)


class ContextSettings(BaseModel):
    """What a `ContextBuilder` needs: routing, the retriever, the pruner (None: off)."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    routing: RoutingSettings = Field(
        default_factory=RoutingSettings, description="How a question is routed."
    )
    retriever: RetrieverName = Field(default=DEFAULT_RETRIEVER, description=RETRIEVER_HELP)
    pruner: PrunerSettings | None = Field(
        default=None, description="The listwise pruner stage (None: off)."
    )
