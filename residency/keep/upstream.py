"""What keeping residency needs of an upstream, of the metrics it counts in and of whoever
watches its evictions: small protocols the router's own objects meet (serve/upstreams.py,
serve/telemetry.py, serve/forensics.py), so this package depends on none of them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from prometheus_client import Counter

from residency.keep.agent_metrics import AgentMetrics
from residency.vllm_client import AsyncVllmClient


class KeptUpstream(Protocol):
    """One vLLM server as the router sees it (serve/upstreams.py `Upstream`)."""

    excluded: str | None  # why it is out of rotation for good (set when it serves another model)

    @property
    def position(self) -> int:
        """Its index in --upstream: the key of everything kept per upstream."""
        ...

    @property
    def client(self) -> AsyncVllmClient:
        """The HTTP client for it."""
        ...

    @property
    def model(self) -> str | None:
        """The served model name, once known."""
        ...

    @property
    def outstanding(self) -> int:
        """The router's requests in flight on it."""
        ...

    @property
    def url(self) -> str:
        """Its base URL."""
        ...

    @property
    def label(self) -> str:
        """Its metric label."""
        ...

    @property
    def usable(self) -> bool:
        """Healthy and not excluded."""
        ...


class KeepMetrics(Protocol):
    """The counters the token-count source adds to (serve/telemetry.py `RouterMetrics`)."""

    @property
    def prefix_evictions(self) -> Counter:
        """Requests whose usage shows their prefix evicted, by prefix."""
        ...

    @property
    def keep_warm_touches(self) -> Counter:
        """Touches sent, by prefix and result."""
        ...

    @property
    def agent(self) -> AgentMetrics:
        """The agent's metrics (keep-warm requests and prefill tokens)."""
        ...


class ResidencyObserver(Protocol):
    """What is told of each upstream's planned blocks (serve/forensics.py `Forensics`)."""

    def evicted(
        self, up: KeptUpstream, prefix: str, resident: int, total: int, engine_ts: float
    ) -> None:
        """Blocks of a planned prefix were evicted on `up`."""

    def published(self, upstream: str, prefix: str, resident: int, total: int) -> None:
        """The prefix's resident and total blocks after a batch."""

    def rewarmed(self, upstream: str, prefix: str, reason: str, result: str) -> None:
        """A re-warm of the prefix finished."""


@dataclass(frozen=True, slots=True)
class KeepSettings:
    """The serve flags keeping residency reads (--warm, --kv-events, --kv-event-max-bytes,
    --rewarm-interval, --rewarm-wait, --request-timeout, VLLM_API_KEY)."""

    warm_on_join: bool
    kv_events: Literal["auto", "off"]
    kv_event_max_bytes: int
    rewarm_interval_s: float
    rewarm_wait_s: float
    request_timeout_s: float
    upstream_api_key: str | None
