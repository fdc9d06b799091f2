"""Where the pruner's grading model runs and how its grades become a kept set
(`PrunerSettings`), and the flags it needs on its vLLM: apart from the pruner itself, so the CLI
declares `--pruner-*` flags without importing the HTTP clients. residency/context/pruner.py says
why the server needs `PRUNER_SERVER_ARGS`."""

from __future__ import annotations

import shlex

from pydantic import BaseModel, ConfigDict, Field

from residency.flags import Flag
from residency.prompt_language import LanguageCode
from residency.vllm_client import endpoints

PRUNER_FLAG = "--pruner-url"
PRUNER_SERVER_ARGS: tuple[str, ...] = (
    "--structured-outputs-config",
    '{"backend": "xgrammar", "disable_any_whitespace": true}',
)
PRUNER_SERVER_FLAG = shlex.join(PRUNER_SERVER_ARGS)  # quoted, to paste into a shell


class PrunerSettings(BaseModel):
    """Where the grading model runs and how its grades become a kept set: the one pruner
    configuration, behind `residency serve --pruner-*` and `residency eval prune`."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    url: str = Field(
        min_length=1,
        max_length=2048,
        pattern=r"^https?://",
        description="OpenAI-compatible base URL of the small model that grades passages, e.g. "
        f"http://127.0.0.1:8001 (with or without /v1); start its vLLM with {PRUNER_SERVER_FLAG}.",
    )
    model: str = Field(
        default="",
        max_length=512,
        description="Served model that grades (default: the server's own, the first it lists).",
    )
    threshold: int = Field(
        default=3,
        ge=1,
        le=5,
        description="Keep passages graded at or above this (5 essential ... 1 unrelated).",
    )
    keep_top_k: int = Field(
        default=2,
        ge=0,
        le=1000,
        description="Always keep this many best-ranked passages, whatever their grade.",
    )
    timeout_s: float = Field(
        default=10.0,
        gt=0,
        le=600,
        description="Seconds a grading call may take; past it, every passage is kept.",
    )
    max_tokens: int = Field(
        default=2048,
        ge=16,
        le=65536,
        description="Cap on reply tokens; a request asks for min(this, 16 + 48 x passages).",
    )
    api_key: str | None = Field(
        default=None,
        min_length=1,
        max_length=4096,
        repr=False,
        description="Bearer token for the endpoint, if it wants one.",
    )
    language: LanguageCode = Field(
        default="ja", description="The corpus language the prompt is worded in (ja: bilingual)."
    )

    @property
    def chat_url(self) -> str:
        """The chat-completions endpoint under `url`."""
        return endpoints.url_of(self.url, endpoints.CHAT)


# The pruner's flags, as `serve` and `eval prune` both spell them. Its own token stays unset:
# --api-key is what clients send the router.
PRUNER_FLAGS = {
    "url": Flag("--pruner-url"),
    "model": Flag("--pruner-model"),
    "threshold": Flag("--prune-threshold"),
    "keep_top_k": Flag("--prune-keep-top-k"),
    "timeout_s": Flag("--pruner-timeout"),
}
PRUNER_SKIP = frozenset({"api_key", "max_tokens", "language"})
