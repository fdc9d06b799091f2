"""`residency serve` settings: one pydantic model, validated before anything starts."""

from __future__ import annotations

import datetime as dt
import ipaddress
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from residency.retrieval.qdrant_schema import QdrantOptions
from residency.routing import DEFAULT_HEDGE, DEFAULT_K, DEFAULT_MARGIN

RetrieverName = Literal["hybrid", "bm25", "dense", "qdrant"]
# --watch-plan polls plan.json's mtime and size this often (its sha256 only when they change).
WATCH_PLAN_INTERVAL_S = 2.0


class PrunerOptions(BaseModel):
    """The optional listwise pruner stage (off unless `url` is set)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    url: str | None = Field(default=None, description="--pruner-url: OpenAI-compatible base URL.")
    model: str | None = Field(default=None, description="--pruner-model (default: its only one).")
    threshold: int = Field(default=3, ge=1, le=5, description="--prune-threshold: keep grades >=.")
    keep_top_k: int = Field(default=2, ge=0, le=100, description="--prune-keep-top-k floor.")
    timeout_s: float = Field(default=10.0, gt=0, le=600, description="--pruner-timeout.")


class RequestLimits(BaseModel):
    """What one client request may cost the router (each limit is a `residency serve` flag)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_body_bytes: int = Field(
        default=1_048_576, ge=1024, le=1 << 30, description="--max-body-bytes (413 beyond)."
    )
    max_question_chars: int = Field(
        default=2000,
        ge=1,
        le=1_000_000,
        description="--max-question-chars: retrieval and the query log use this much of the "
        "question (the whole question is still answered).",
    )
    max_concurrent: int = Field(
        default=256, ge=1, le=100_000, description="--max-concurrent requests (429 beyond)."
    )
    header_timeout_s: float = Field(
        default=10.0, gt=0, le=3600, description="--header-timeout: request line and headers."
    )
    body_timeout_s: float = Field(
        default=30.0, gt=0, le=3600, description="--body-timeout: the whole body (408 beyond)."
    )


class ServeSettings(BaseModel):
    """Everything the router needs; built by the CLI from flags."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    plan: Path = Field(description="--plan: plan.json whose prefix every request starts with.")
    index: Path | None = Field(default=None, description="--index (default: the plan's index).")
    upstreams: tuple[str, ...] = Field(
        min_length=1, max_length=64, description="--upstream: vLLM base URLs (repeatable)."
    )
    host: str = Field(default="127.0.0.1", min_length=1, description="--host to bind.")
    port: int = Field(default=8100, ge=0, le=65535, description="--port (0: pick a free one).")
    api_key: str | None = Field(
        default=None, min_length=8, description="--api-key clients must send (Bearer)."
    )
    upstream_api_key: str | None = Field(default=None, description="--upstream-api-key.")
    log: Path | None = Field(description="--log: query log appended per request (None: off).")
    k: int = Field(default=DEFAULT_K, ge=0, le=100, description="--k long-tail chunks.")
    margin: int = Field(default=DEFAULT_MARGIN, ge=0, le=100, description="--margin.")
    hedge: int = Field(default=DEFAULT_HEDGE, ge=0, le=100, description="--hedge.")
    retriever: RetrieverName = Field(default="hybrid", description="--retriever.")
    qdrant: QdrantOptions | None = Field(
        default=None, description="--qdrant, --collection, ... (with --retriever qdrant)."
    )
    prefetch: int = Field(default=40, ge=1, le=1000, description="Chunks fetched before routing.")
    today: dt.date | None = Field(
        default=None, description="--today for time expressions (None: the local date)."
    )
    max_dated: int = Field(default=5, ge=0, le=50, description="--max-dated sections pinned.")
    pruner: PrunerOptions = Field(default_factory=PrunerOptions, description="Pruner stage.")
    warm: bool = Field(default=True, description="--warm/--no-warm each upstream as it joins.")
    watch_plan: bool = Field(
        default=False, description="--watch-plan: reload when plan.json's content changes."
    )
    health_interval_s: float = Field(default=5.0, gt=0, le=3600, description="--health-interval.")
    request_timeout_s: float = Field(default=600.0, gt=0, description="--request-timeout.")
    limits: RequestLimits = Field(
        default_factory=lambda: RequestLimits(), description="What one request may cost."
    )
    allow_origins: tuple[str, ...] = Field(
        default=(), max_length=64, description="--allow-origin: browser origins let in."
    )
    allow_hosts: tuple[str, ...] = Field(
        default=(), max_length=64, description="--allow-host: Host names accepted besides --host."
    )
    allow_prompt_readback: bool = Field(
        default=False, description="--allow-prompt-readback: echo, prompt_logprobs, token ids."
    )

    @model_validator(mode="after")
    def _qdrant(self) -> ServeSettings:
        if (self.retriever == "qdrant") != (self.qdrant is not None):
            raise ValueError("--retriever qdrant and --qdrant URL|PATH go together")
        return self

    @model_validator(mode="after")
    def _exposure(self) -> ServeSettings:
        if not is_loopback(self.host) and self.api_key is None:
            raise ValueError(
                f"--host {self.host} exposes the router beyond this machine; pass --api-key "
                "(or RESIDENCY_API_KEY) or bind --host 127.0.0.1"
            )
        return self


def is_loopback(host: str) -> bool:
    """True for localhost and loopback addresses (127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
