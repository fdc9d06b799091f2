"""What `residency eval coverage` is asked: the simulated traffic (`TrafficOptions`) and the
routing and simulation knobs (`CoverageOptions`). Pydantic only, so the command's `--help` is
built from these fields without importing the simulation."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator

from planner.budget import ConcurrentRequests
from residency.context.routing import RoutingSettings
from residency.eval.defaults import DEFAULT_EVAL_SIZE, DEFAULT_LOG_SIZE, DEFAULT_ZIPF_S
from residency.flags import Flag, MaxModelLen, Replicas, Section, VllmServer

DEFAULT_BUDGET_TOKENS = 30000


class TrafficOptions(BaseModel):
    """How much traffic to draw, how skewed, and from which seed."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    zipf_s: Annotated[float, Flag("--zipf")] = Field(
        default=DEFAULT_ZIPF_S,
        gt=0,
        le=10,
        description="Zipf exponent s of paragraph popularity (--squad): rank r is asked "
        "in proportion to 1 / r^s.",
    )
    log_size: int = Field(
        default=DEFAULT_LOG_SIZE,
        ge=1,
        le=10**8,
        description="Simulated log questions the planner sees (--squad).",
    )
    eval_size: int = Field(
        default=DEFAULT_EVAL_SIZE,
        ge=1,
        le=10**8,
        description="Simulated evaluation questions, disjoint from the log (--squad).",
    )
    seed: int = Field(
        default=0,
        ge=0,
        le=2**63,
        description="Seed of the simulation and of random residency.",
    )


class CoverageOptions(BaseModel):
    """The routing every row is evaluated with, and the simulation's budget and host."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    budget_tokens: Annotated[int, Flag("--budget")] = Field(
        default=DEFAULT_BUDGET_TOKENS,
        ge=1,
        le=10**9,
        description="Resident budget in tokens for every strategy (--squad).",
    )
    kv_cache_tokens: Annotated[int | None, Flag(show_default=False)] = Field(
        default=None,
        ge=1,
        le=10**10,
        description="--squad: model a host with this many KV-cache tokens (with "
        "--max-model-len): adds the rows single-prefix and residency (several prefixes, as "
        "served).",
    )
    max_model_len: MaxModelLen = None
    # --squad: the modelled host is the server's (vllm:cache_config_info, /v1/models)
    server: VllmServer = None
    # --squad: requests the modelled host serves at once; the planner's own --concurrency
    concurrency: ConcurrentRequests = 1
    replicas: Replicas = 1
    seeds: int = Field(
        default=1,
        ge=1,
        le=1000,
        description="--squad: run this many traffic seeds (--seed, --seed + 1, ...) and report "
        "each row's mean and sd.",
    )
    routing: Annotated[RoutingSettings, Section(panel="Routing (as `residency serve`)")] = Field(
        default_factory=RoutingSettings,
        description="The router's routing: every row but plain RAG is evaluated with it.",
    )

    @model_validator(mode="after")
    def _together(self) -> CoverageOptions:
        if self.routing.k < 1:
            raise ValueError(
                f"--k {self.routing.k}: eval coverage compares RAG at the router's k; give --k 1 "
                "or more"
            )
        if self.server is not None and (self.kv_cache_tokens or self.max_model_len):
            raise ValueError(
                f"--server {self.server} describes the host: drop --kv-cache-tokens and "
                "--max-model-len"
            )
        if (self.kv_cache_tokens is None) != (self.max_model_len is None):
            raise ValueError("--kv-cache-tokens and --max-model-len describe the host together")
        return self
