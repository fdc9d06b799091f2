"""`residency serve` settings: one pydantic model, validated before anything starts."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from residency.context.pruner_settings import PRUNER_FLAGS, PRUNER_SKIP, PrunerSettings
from residency.context.routing import RoutingSettings
from residency.context.settings import (
    DEFAULT_RETRIEVER,
    RETRIEVER_HELP,
    ContextSettings,
    RetrieverName,
)
from residency.flags import (
    DEFAULT_REQUEST_TIMEOUT_S,
    Flag,
    IndexDir,
    RequestTimeout,
    RouterApiKey,
    Section,
    VllmApiKey,
)
from residency.retrieval.qdrant_schema import QDRANT_SECTION, QdrantOptions
from residency.serve.agent_settings import AGENT, AgentSettings

# --watch-plan polls plan.json's mtime and size this often (its sha256 only when they change).
WATCH_PLAN_INTERVAL_S = 2.0
DEFAULT_UPSTREAM = "http://127.0.0.1:8000"
ROUTE = "Routing"
NET = "Network"
PRUNE = "Pruner (off without --pruner-url)"
SAFE = "Limits and safety"


class RequestLimits(BaseModel):
    """What one client request may cost the router (each limit is a `residency serve` flag)."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    max_body_bytes: int = Field(
        default=1_048_576, ge=1024, le=1 << 30, description="Largest request body (413 beyond)."
    )
    max_question_chars: int = Field(
        default=2000,
        ge=1,
        le=1_000_000,
        description="Characters of the question used for retrieval and the query log (a longer "
        "question is still answered whole).",
    )
    max_concurrent: int = Field(
        default=256,
        ge=1,
        le=100_000,
        description="Generation requests in flight, streams included, counted once their body "
        "is in; a request asking for n (or best_of) completions counts n times (429 beyond).",
    )
    max_n: int = Field(
        default=8,
        ge=1,
        le=1024,
        description="Completions one request may ask for with n or best_of (400 beyond).",
    )
    max_header_bytes: int = Field(
        default=65_536,
        ge=1024,
        le=16 * 1024 * 1024,
        description="Bytes of a request line and headers; refused (431) as soon as they are "
        "past it, before more is read.",
    )
    max_headers: int = Field(
        default=256, ge=8, le=10_000, description="Header fields in one request (431 beyond)."
    )
    header_timeout_s: Annotated[float, Flag("--header-timeout")] = Field(
        default=10.0,
        gt=0,
        le=3600,
        description="Seconds a connection may take to send its request line and headers.",
    )
    body_timeout_s: Annotated[float, Flag("--body-timeout")] = Field(
        default=30.0, gt=0, le=3600, description="Seconds a request body may take (408 beyond)."
    )


class ServeSettings(BaseModel):
    """Everything the router needs; built by the CLI from flags (each description is the help)."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    plan: Path = Field(description="plan.json whose prefix every request starts with.")
    index: IndexDir = None
    upstreams: Annotated[tuple[str, ...], Flag("--upstream")] = Field(
        default=(DEFAULT_UPSTREAM,),
        min_length=1,
        max_length=64,
        description="vLLM base URL (repeatable; balanced by least outstanding requests).",
    )
    replicas: Annotated[tuple[str, ...], Flag("--replica")] = Field(
        default=(),
        max_length=1024,
        description="A vLLM replica behind a router given as --upstream (vllm-router): "
        "warmed and kept directly with its prefixes of the plan's placement, in placement "
        "order (repeatable); requests still go to --upstream.",
    )
    host: Annotated[str, Flag(panel=NET)] = Field(
        default="127.0.0.1",
        min_length=1,
        description="Address to bind; beyond loopback needs --api-key.",
    )
    port: Annotated[int, Flag(panel=NET)] = Field(
        default=8100, ge=0, le=65535, description="Port to listen on (0: pick a free one)."
    )
    api_key: Annotated[RouterApiKey, Flag(panel=NET)] = None
    upstream_api_key: Annotated[VllmApiKey, Flag(panel=NET)] = None
    log: Path | None = Field(
        default=None,
        description="Query log appended per request, what `residency plan --log` reads "
        "(default: query-log.jsonl beside --plan; --no-log: none).",
    )
    routing: Annotated[RoutingSettings, Section(panel=ROUTE)] = Field(
        default_factory=RoutingSettings, description="How a question is routed."
    )
    retriever: Annotated[RetrieverName, Flag(panel=ROUTE)] = Field(
        default=DEFAULT_RETRIEVER, description=RETRIEVER_HELP
    )
    qdrant: Annotated[QdrantOptions | None, QDRANT_SECTION] = Field(
        default=None, description="The Qdrant collection (with --retriever qdrant)."
    )
    pruner: Annotated[
        PrunerSettings | None, Section(PRUNE, flags=PRUNER_FLAGS, skip=PRUNER_SKIP)
    ] = Field(default=None, description="The listwise pruner stage (None: off).")
    warm: bool = Field(
        default=True, description="Warm each upstream with the plan's prefix as it joins."
    )
    keep_warm: bool = Field(
        default=True,
        description="Touch a prefix no question has used while the others' traffic allocated "
        "half the plan's headroom, before vLLM's LRU evicts it (plans with several prefixes).",
    )
    agent: Annotated[AgentSettings, Section(panel=AGENT)] = Field(
        default_factory=lambda: AgentSettings(),
        description="KV events, re-planning and the recall canary.",
    )
    watch_plan: Annotated[bool, Flag("--watch-plan")] = Field(
        default=False,
        description=f"Reload --plan when its content changes (checked every "
        f"{WATCH_PLAN_INTERVAL_S:g} s), as SIGHUP does.",
    )
    health_interval_s: Annotated[float, Flag("--health-interval")] = Field(
        default=5.0, gt=0, le=3600, description="Seconds between upstream health checks."
    )
    request_timeout_s: RequestTimeout = DEFAULT_REQUEST_TIMEOUT_S
    shutdown_timeout_s: Annotated[float, Flag("--shutdown-timeout")] = Field(
        default=60.0,
        gt=0,
        le=3600,
        description="Seconds after SIGTERM the requests in flight may take to finish (long "
        "enough for a 32K-token prompt on an H100 or a large CPU host); then each still "
        "running gets a 503 (or an error event, streaming) and the router exits.",
    )
    limits: Annotated[RequestLimits, Section(panel=SAFE)] = Field(
        default_factory=lambda: RequestLimits(), description="What one request may cost."
    )
    allow_origins: Annotated[tuple[str, ...], Flag("--allow-origin", panel=SAFE)] = Field(
        default=(),
        max_length=64,
        description="Browser origin let in, e.g. https://app.example (repeatable; requests "
        "carrying any other Origin get 403).",
    )
    allow_hosts: Annotated[tuple[str, ...], Flag("--allow-host", panel=SAFE)] = Field(
        default=(),
        max_length=64,
        description="Host header name accepted besides --host (repeatable; e.g. behind a proxy).",
    )
    allow_prompt_readback: Annotated[bool, Flag(panel=SAFE)] = Field(
        default=False,
        description="Pass echo, prompt_logprobs, return_token_ids and return_tokens_as_token_ids "
        "on: they return the hidden prompt (prefix and retrieved passages).",
    )

    @property
    def context(self) -> ContextSettings:
        """The question-to-context pipeline's part of these settings (what a ContextBuilder
        takes)."""
        return ContextSettings(routing=self.routing, retriever=self.retriever, pruner=self.pruner)

    @field_validator("api_key")
    @classmethod
    def _exposure(cls, api_key: str | None, info: ValidationInfo) -> str | None:
        # A field check, not a model one, so the CLI's refusal names --api-key in one line.
        host = info.data.get("host")
        if api_key is None and host is not None and not is_loopback(host):
            raise ValueError(
                f"--host {host} exposes the router beyond this machine; pass --api-key "
                "(or RESIDENCY_API_KEY) or bind --host 127.0.0.1"
            )
        return api_key

    @model_validator(mode="after")
    def _qdrant(self) -> ServeSettings:
        if (self.retriever == "qdrant") != (self.qdrant is not None):
            raise ValueError("--retriever qdrant and --qdrant URL|PATH go together")
        return self


def is_loopback(host: str) -> bool:
    """True for localhost and loopback addresses (127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
