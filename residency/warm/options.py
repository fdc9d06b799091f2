"""What `residency warm` is asked (`WarmOptions`, and `WatchSettings` for --watch), apart from the
HTTP client and the plan model, so the command declares its flags from these fields and its
`--help` imports neither."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from residency.flags import (
    DEFAULT_REQUEST_TIMEOUT_S,
    DEFAULT_VLLM_URL,
    Flag,
    RequestTimeout,
    VllmApiKey,
    VllmServer,
)

WATCH = "Keep warm (--watch)"


class WarmOptions(BaseModel):
    """How `residency warm` talks to the server and how hard it tries."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    server: VllmServer = None
    timeout_s: Annotated[float, Flag("--timeout")] = Field(
        default=120.0,
        gt=0,
        description="Seconds to wait for /health (exponential backoff).",
    )
    request_timeout_s: RequestTimeout = DEFAULT_REQUEST_TIMEOUT_S
    max_sightings: int = Field(
        default=4,
        ge=0,
        le=64,
        description="Re-sends of the prefix until one hits (hybrid models may admit a prefix "
        "only on a later sighting); 0: send once, a check that exits 2 unless already resident.",
    )
    allow_model_mismatch: bool = Field(
        default=False,
        description="Accept a served model whose name differs from the plan's (the tokenizer, "
        "max_model_len and prefix hash are still checked).",
    )
    api_key: VllmApiKey = None

    @property
    def url(self) -> str:
        """The server's base URL: --server, or where `vllm serve` listens by default."""
        return self.server or DEFAULT_VLLM_URL


class WatchSettings(BaseModel):
    """How `residency warm --watch` probes and waits."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    interval_s: Annotated[float, Flag("--interval")] = Field(
        default=15.0, gt=0, description="Seconds between probes."
    )
    max_backoff_s: Annotated[float, Flag("--max-backoff")] = Field(
        default=60.0, gt=0, description="Longest wait while the server is down."
    )
    metrics_port: int | None = Field(
        default=None,
        ge=1,
        le=65535,
        description="Serve residency_warm_* Prometheus metrics on this port.",
    )
    metrics_host: str = Field(
        default="127.0.0.1", min_length=1, description="Address the metrics endpoint binds."
    )
