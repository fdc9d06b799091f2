"""What `residency eval answers` is asked (`AnswerEvalOptions`): strategies, endpoints, sizes.
Pydantic only, so the command declares its flags from these fields and its `--help` imports
neither the clients nor the report models."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from residency.eval.answers.defaults import DEFAULT_JUDGE_MAX_TOKENS, DEFAULT_K, DEFAULT_MAX_TOKENS
from residency.flags import Flag, RouterApiKey

StrategyName = Literal["echo", "rag", "whole", "residency"]
STRATEGIES: tuple[StrategyName, ...] = ("echo", "rag", "whole", "residency")
PassageCount = Annotated[int, Field(ge=1, le=1000)]


def default_strategies(router: str | None) -> tuple[StrategyName, ...]:
    """echo + rag + whole, and residency when a router is given."""
    return STRATEGIES if router else ("echo", "rag", "whole")


class AnswerEvalOptions(BaseModel):
    """The strategies to compare, the servers that answer and judge, and the answer sizes."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    strategy: list[StrategyName] | None = Field(
        default=None,
        min_length=1,
        description="echo (the question as its answer: the scorer's floor, no model), rag, whole "
        "or residency (repeatable; default echo + rag + whole, + residency with --router).",
    )
    generator: str | None = Field(
        default=None,
        max_length=4096,
        description="OpenAI-compatible URL answering rag and whole (vLLM).",
    )
    generator_model: str | None = Field(
        default=None,
        max_length=4096,
        description="Model to ask for (default: the server's only model).",
    )
    judge: str | None = Field(
        default=None,
        max_length=4096,
        description="OpenAI-compatible URL of an LLM judge (may be --generator's); without it "
        "the reference scorer (token F1, key facts, abstention) grades alone.",
    )
    judge_model: str | None = Field(
        default=None,
        max_length=4096,
        description="Judge model (default: the judge server's only model).",
    )
    router: str | None = Field(
        default=None,
        max_length=4096,
        description="URL of `residency serve` (strategy residency).",
    )
    plan: Path | None = Field(
        default=None,
        description="plan.json the router serves: resident gold counts as visible.",
    )
    k: Annotated[list[PassageCount] | None, Flag("--rag-k", show_default=str(DEFAULT_K))] = Field(
        default=None,
        min_length=1,
        max_length=64,
        description="Passages retrieved per question (rag); repeat for one rag per value "
        "(--rag-k 3 --rag-k 5).",
    )
    max_tokens: int = Field(
        default=DEFAULT_MAX_TOKENS,
        ge=1,
        le=1_000_000,
        description="max_tokens of every answer (temperature 0).",
    )
    judge_max_tokens: int = Field(
        default=DEFAULT_JUDGE_MAX_TOKENS,
        ge=1,
        le=1_000_000,
        description="max_tokens of every judge verdict.",
    )
    limit: int | None = Field(
        default=None, ge=1, description="Only the first N questions of the file."
    )
    records: Path | None = Field(
        default=None,
        description="Write per-question records here (jsonl, one line per answer).",
    )
    api_key: RouterApiKey = None  # sent to every endpoint

    @field_validator("strategy", mode="before")
    @classmethod
    def _spelled_any_case(cls, value: Any) -> Any:
        """--strategy RAG reads as rag."""
        if isinstance(value, list | tuple):
            return [v.strip().lower() if isinstance(v, str) else v for v in value]
        return value

    @property
    def strategies(self) -> tuple[StrategyName, ...]:
        """The strategies asked, each once in the order given, or the default set."""
        if not self.strategy:
            return default_strategies(self.router)
        return tuple(dict.fromkeys(self.strategy))

    @property
    def ks(self) -> tuple[int, ...]:
        """One rag per distinct k, in the order given."""
        return tuple(dict.fromkeys(self.k)) if self.k else (DEFAULT_K,)
