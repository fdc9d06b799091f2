"""The router's `GET /residency` answer (what `residency status` reads): per upstream and
planned prefix, resident blocks, state, recent hits and misses, the last eviction and what the
router had admitted just before it, re-warms and the residency mode."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Mode = Literal["events", "token_count"]
State = Literal["resident", "partial", "evicted", "warming"]
_FROZEN = ConfigDict(frozen=True, extra="forbid")


class AdmittedRequest(BaseModel):
    """A request the router handed to the upstream shortly before an eviction."""

    model_config = _FROZEN
    before_s: float = Field(ge=0, description="Seconds between its admission and the eviction.")
    prefix: str | None = Field(description="The resident prefix it went out with.")
    route: str = Field(description="resident or long_tail.")
    prompt_tokens: int | None = Field(ge=0, description="usage.prompt_tokens (None: in flight).")
    uncached_tokens: int | None = Field(
        ge=0, description="Prompt tokens it prefilled (prompt minus cached; None: in flight)."
    )


class EvictionRecord(BaseModel):
    """One eviction of planned blocks, from the upstream's KV events."""

    model_config = _FROZEN
    at_unix_s: float = Field(ge=0, description="When the router read the eviction (Unix time).")
    engine_at_unix_s: float = Field(
        ge=0, description="The event batch's timestamp: when vLLM published the eviction."
    )
    upstream: str = Field(description="The upstream's position in --upstream.")
    prefix: str = Field(description="The plan's prefix id.")
    blocks_lost: int = Field(ge=0, description="Resident blocks of the prefix it took.")
    resident_blocks: int = Field(ge=0, description="Leading blocks still resident after it.")
    total_blocks: int = Field(ge=0, description="Cacheable blocks of the prefix.")
    kv_cache_usage_perc: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="vLLM's vllm:kv_cache_usage_perc right after (cached idle blocks count as "
        "free); None when unread.",
    )
    admitted: list[AdmittedRequest] = Field(
        description="The router's requests to that upstream in the preceding second."
    )


class PrefixStatus(BaseModel):
    """One planned prefix on one upstream."""

    model_config = _FROZEN
    upstream: str = Field(description="The upstream's position in --upstream.")
    prefix: str = Field(description="The plan's prefix id.")
    mode: Mode = Field(description="events (vLLM's KV events) or token_count (keep-warm).")
    resident_blocks: int | None = Field(
        ge=0, description="Leading blocks resident (events mode; None: token count)."
    )
    total_blocks: int | None = Field(ge=0, description="Cacheable blocks (None: unknown).")
    state: State = Field(
        description="resident (whole), partial, evicted (none left) or warming (a re-warm is "
        "waiting or under way). In token-count mode: evicted when the last request found it "
        "short, else resident."
    )
    hits: int = Field(ge=0, description="Recent requests that found the prefix cached.")
    misses: int = Field(ge=0, description="Recent requests that found it short.")
    rewarms: int = Field(ge=0, description="Re-warms after evictions, clears or restarts.")
    last_eviction: EvictionRecord | None = Field(description="The newest eviction, if any.")


class UpstreamStatus(BaseModel):
    """One upstream."""

    model_config = _FROZEN
    upstream: str = Field(description="Its position in --upstream.")
    healthy: bool = Field(description="In rotation (answers /health, not excluded).")
    mode: Mode = Field(description="Where residency comes from on it.")
    evictions: int = Field(ge=0, description="Evictions of planned blocks recorded on it.")


class ResidencyStatus(BaseModel):
    """The whole picture at one moment."""

    model_config = _FROZEN
    plan_sha256: str = Field(description="The plan being served.")
    recent_requests: int = Field(ge=1, description="N: hits and misses count the last N.")
    ready: bool = Field(description="Every planned prefix resident on a healthy upstream.")
    missing: list[str] = Field(description="Planned prefixes resident on no healthy upstream.")
    upstreams: list[UpstreamStatus] = Field(description="Every upstream, in --upstream order.")
    prefixes: list[PrefixStatus] = Field(description="Upstream x prefix, upstream order.")
    evictions: list[EvictionRecord] = Field(
        default_factory=list, description="The newest evictions recorded, oldest first."
    )
