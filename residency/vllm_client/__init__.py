"""The vLLM client: every HTTP call residency makes to a vLLM (or OpenAI-compatible) server, and
the only place their URLs are built. Talks and parses; decides nothing.

`VllmClient` (sync: warm, plan, bench, eval, demo) and `AsyncVllmClient` (the router and its
pruner) share one vocabulary (`wire`: served models, usage, streamed answers, prefills, error
text), one path table (`endpoints`), one SSE parser (`sse`) and one Prometheus reader
(`metrics`). Imports nothing of residency but `errors`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from residency.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from residency.vllm_client.async_client import (
        AnswerTimeoutError,
        AsyncVllmClient,
        Session,
        TransportError,
        UnreachedError,
        UpstreamStream,
        open_session,
    )
    from residency.vllm_client.health import Backoff, wait_for_health
    from residency.vllm_client.metrics import Sample, find_samples, parse_prometheus, sum_samples
    from residency.vllm_client.sync_client import VllmClient
    from residency.vllm_client.wire import (
        CACHE_CONFIG_METRIC,
        TTFT_METHOD,
        Completion,
        RawAnswer,
        RefusedError,
        SendResult,
        ServedModel,
        StreamedAnswer,
        Usage,
    )

__all__ = [
    "CACHE_CONFIG_METRIC",
    "TTFT_METHOD",
    "AnswerTimeoutError",
    "AsyncVllmClient",
    "Backoff",
    "Completion",
    "RawAnswer",
    "RefusedError",
    "Sample",
    "SendResult",
    "ServedModel",
    "Session",
    "StreamedAnswer",
    "TransportError",
    "UnreachedError",
    "UpstreamStream",
    "Usage",
    "VllmClient",
    "find_samples",
    "open_session",
    "parse_prometheus",
    "sum_samples",
    "wait_for_health",
]

__getattr__ = lazy_exports(__name__, __file__)
