"""`residency serve`: run the OpenAI-compatible router in front of one or more vLLM servers.

Every option but the lists, --today and --no-log is bound to a field of `ServeSettings`,
`RequestLimits`, `PrunerSettings` or `QdrantOptions` (residency/cli/fields.py): the field holds
the help, the bounds, the choices and the default.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Annotated

import typer

from residency.cli.fields import bind, default_of, option_from
from residency.cli.options import PlanOption
from residency.cli.qdrant_options import (
    DEFAULT_FUSION,
    QdrantApiKey,
    QdrantCollection,
    QdrantFusion,
    QdrantLocation,
    qdrant_options,
)
from residency.errors import ConfigError
from residency.serve.pruner_settings import PrunerSettings
from residency.serve.settings import RequestLimits, RetrieverName, ServeSettings

_ROUTE = "Routing"
_NET = "Network"
_PRUNE = "Pruner (off without --pruner-url)"
_SAFE = "Limits and safety"
S, L, P = ServeSettings, RequestLimits, PrunerSettings


def _help(name: str) -> str | None:
    """The help of a flag that cannot be bound to its field (a list, or a date typer lacks)."""
    return ServeSettings.model_fields[name].description


def serve(
    plan: PlanOption = Path("plan.json"),
    upstream: Annotated[
        list[str] | None,
        typer.Option(help=_help("upstreams"), show_default=default_of(S, "upstreams")[0]),
    ] = None,
    index: Annotated[Path | None, option_from(S, "index")] = default_of(S, "index"),
    host: Annotated[str, option_from(S, "host", rich_help_panel=_NET)] = default_of(S, "host"),
    port: Annotated[int, option_from(S, "port", rich_help_panel=_NET)] = default_of(S, "port"),
    api_key: Annotated[
        str | None, option_from(S, "api_key", envvar="RESIDENCY_API_KEY", rich_help_panel=_NET)
    ] = default_of(S, "api_key"),
    upstream_api_key: Annotated[
        str | None,
        option_from(S, "upstream_api_key", envvar="VLLM_API_KEY", rich_help_panel=_NET),
    ] = default_of(S, "upstream_api_key"),
    log: Annotated[Path | None, option_from(S, "log")] = None,
    no_log: Annotated[bool, typer.Option("--no-log", help="Do not write a query log.")] = False,
    k: Annotated[int, option_from(S, "k", rich_help_panel=_ROUTE)] = default_of(S, "k"),
    margin: Annotated[int, option_from(S, "margin", rich_help_panel=_ROUTE)] = default_of(
        S, "margin"
    ),
    hedge: Annotated[int, option_from(S, "hedge", rich_help_panel=_ROUTE)] = default_of(S, "hedge"),
    hops: Annotated[int, option_from(S, "hops", rich_help_panel=_ROUTE)] = default_of(S, "hops"),
    retriever: Annotated[
        RetrieverName, option_from(S, "retriever", rich_help_panel=_ROUTE)
    ] = default_of(S, "retriever"),
    today: Annotated[str | None, typer.Option(help=_help("today"), rich_help_panel=_ROUTE)] = None,
    max_dated: Annotated[int, option_from(S, "max_dated", rich_help_panel=_ROUTE)] = default_of(
        S, "max_dated"
    ),
    url: Annotated[
        str | None, option_from(P, "url", "--pruner-url", rich_help_panel=_PRUNE)
    ] = None,
    model: Annotated[
        str, option_from(P, "model", "--pruner-model", rich_help_panel=_PRUNE)
    ] = default_of(P, "model"),
    threshold: Annotated[
        int, option_from(P, "threshold", "--prune-threshold", rich_help_panel=_PRUNE)
    ] = default_of(P, "threshold"),
    keep_top_k: Annotated[
        int, option_from(P, "keep_top_k", "--prune-keep-top-k", rich_help_panel=_PRUNE)
    ] = default_of(P, "keep_top_k"),
    timeout_s: Annotated[
        float, option_from(P, "timeout_s", "--pruner-timeout", rich_help_panel=_PRUNE)
    ] = default_of(P, "timeout_s"),
    warm: Annotated[bool, option_from(S, "warm")] = default_of(S, "warm"),
    keep_warm: Annotated[bool, option_from(S, "keep_warm")] = default_of(S, "keep_warm"),
    watch_plan: Annotated[bool, option_from(S, "watch_plan", "--watch-plan")] = default_of(
        S, "watch_plan"
    ),
    health_interval_s: Annotated[
        float, option_from(S, "health_interval_s", "--health-interval")
    ] = default_of(S, "health_interval_s"),
    request_timeout_s: Annotated[
        float, option_from(S, "request_timeout_s", "--request-timeout")
    ] = default_of(S, "request_timeout_s"),
    max_body_bytes: Annotated[
        int, option_from(L, "max_body_bytes", rich_help_panel=_SAFE)
    ] = default_of(L, "max_body_bytes"),
    max_question_chars: Annotated[
        int, option_from(L, "max_question_chars", rich_help_panel=_SAFE)
    ] = default_of(L, "max_question_chars"),
    max_concurrent: Annotated[
        int, option_from(L, "max_concurrent", rich_help_panel=_SAFE)
    ] = default_of(L, "max_concurrent"),
    max_n: Annotated[int, option_from(L, "max_n", rich_help_panel=_SAFE)] = default_of(L, "max_n"),
    max_header_bytes: Annotated[
        int, option_from(L, "max_header_bytes", rich_help_panel=_SAFE)
    ] = default_of(L, "max_header_bytes"),
    max_headers: Annotated[int, option_from(L, "max_headers", rich_help_panel=_SAFE)] = default_of(
        L, "max_headers"
    ),
    header_timeout_s: Annotated[
        float, option_from(L, "header_timeout_s", "--header-timeout", rich_help_panel=_SAFE)
    ] = default_of(L, "header_timeout_s"),
    body_timeout_s: Annotated[
        float, option_from(L, "body_timeout_s", "--body-timeout", rich_help_panel=_SAFE)
    ] = default_of(L, "body_timeout_s"),
    allow_origin: Annotated[
        list[str] | None, typer.Option(help=_help("allow_origins"), rich_help_panel=_SAFE)
    ] = None,
    allow_host: Annotated[
        list[str] | None, typer.Option(help=_help("allow_hosts"), rich_help_panel=_SAFE)
    ] = None,
    allow_prompt_readback: Annotated[
        bool,
        option_from(S, "allow_prompt_readback", "--allow-prompt-readback", rich_help_panel=_SAFE),
    ] = default_of(S, "allow_prompt_readback"),
    qdrant: QdrantLocation = None,
    collection: QdrantCollection = None,
    qdrant_api_key: QdrantApiKey = None,
    qdrant_fusion: QdrantFusion = DEFAULT_FUSION,
) -> None:
    """Serve /v1/chat/completions and /v1/completions with the resident prefix first.

    SIGHUP (or --watch-plan) reloads --plan without downtime: the new plan is validated and its
    prefixes warmed on every upstream before new requests use it; requests in flight finish on
    the old one; a plan that fails is refused in one log line and the old plan keeps serving.
    SIGHUP and SIGUSR1 reopen the query log (logrotate's postrotate); a rotated or deleted log
    is also noticed on the next line.
    """
    try:
        day = dt.date.fromisoformat(today) if today else None
    except ValueError:
        raise ConfigError(f"--today {today!r}: expected YYYY-MM-DD") from None
    params = locals()
    settings = bind(
        ServeSettings,
        params,
        upstreams=tuple(upstream or default_of(S, "upstreams")),
        log=None if no_log else (log or plan.parent / "query-log.jsonl"),
        qdrant=qdrant_options(retriever, qdrant, collection, qdrant_api_key, qdrant_fusion),
        today=day,
        # PrunerSettings.api_key is the pruner's own: --api-key is what clients send the router.
        pruner=bind(PrunerSettings, params, api_key=None) if url else None,
        limits=bind(RequestLimits, params),
        allow_origins=tuple(allow_origin or ()),
        allow_hosts=tuple(allow_host or ()),
    )
    from residency.serve.run import run_server  # the router's imports load only when serving

    run_server(settings)
