"""`residency serve`: run the OpenAI-compatible router in front of one or more vLLM servers."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Annotated, Any

import typer

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
from residency.serve.settings import (
    WATCH_PLAN_INTERVAL_S,
    PrunerOptions,
    RequestLimits,
    RetrieverName,
    ServeSettings,
)

_ROUTE = "Routing"
_NET = "Network"
_PRUNE = "Pruner"
_SAFE = "Limits and safety"
_LIMIT = RequestLimits.model_fields  # the defaults, declared once


def _default(name: str) -> Any:
    return _LIMIT[name].default


def serve(
    plan: PlanOption = Path("plan.json"),
    upstream: Annotated[
        list[str] | None,
        typer.Option(
            help="vLLM base URL (repeatable; balanced by least outstanding requests). "
            "Default: http://127.0.0.1:8000."
        ),
    ] = None,
    index: Annotated[
        Path | None, typer.Option(help="Index directory (default: the one the plan names).")
    ] = None,
    host: Annotated[
        str,
        typer.Option(
            help="Address to bind; beyond loopback needs --api-key.", rich_help_panel=_NET
        ),
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.", rich_help_panel=_NET)] = 8100,
    api_key: Annotated[
        str | None,
        typer.Option(
            envvar="RESIDENCY_API_KEY",
            help="Bearer token clients must send (all paths but /health).",
            rich_help_panel=_NET,
        ),
    ] = None,
    upstream_api_key: Annotated[
        str | None,
        typer.Option(
            envvar="VLLM_API_KEY",
            help="Bearer token for the upstreams (vLLM --api-key).",
            rich_help_panel=_NET,
        ),
    ] = None,
    log: Annotated[
        Path | None,
        typer.Option(
            help="Query log appended per request (what `residency plan --log` reads). "
            "Default: query-log.jsonl beside the plan."
        ),
    ] = None,
    no_log: Annotated[bool, typer.Option("--no-log", help="Do not write a query log.")] = False,
    k: Annotated[
        int,
        typer.Option(
            help="Long-tail chunks added when the evidence is not resident.", rich_help_panel=_ROUTE
        ),
    ] = 5,
    margin: Annotated[
        int,
        typer.Option(
            help="A long-tail chunk within this many ranks of a resident top hit is added.",
            rich_help_panel=_ROUTE,
        ),
    ] = 1,
    hedge: Annotated[
        int,
        typer.Option(
            help="Long-tail chunks added even on the resident route.", rich_help_panel=_ROUTE
        ),
    ] = 1,
    retriever: Annotated[
        str,
        typer.Option(
            help="hybrid (dense + BM25, fused), bm25, dense (in process), or qdrant (the "
            "same fusion over the index's Qdrant collection, see --qdrant).",
            rich_help_panel=_ROUTE,
        ),
    ] = "hybrid",
    today: Annotated[
        str | None,
        typer.Option(
            help="Date time expressions resolve against (YYYY-MM-DD; default: today).",
            rich_help_panel=_ROUTE,
        ),
    ] = None,
    max_dated: Annotated[
        int,
        typer.Option(help="Dated sections pinned for a time expression.", rich_help_panel=_ROUTE),
    ] = 5,
    pruner_url: Annotated[
        str | None,
        typer.Option(
            help="OpenAI-compatible URL of a small model that grades passages (off if unset); "
            "serve it with vLLM --structured-outputs-config "
            '\'{"backend": "xgrammar", "disable_any_whitespace": true}\'.',
            rich_help_panel=_PRUNE,
        ),
    ] = None,
    pruner_model: Annotated[
        str | None, typer.Option(help="The pruner's model name.", rich_help_panel=_PRUNE)
    ] = None,
    prune_threshold: Annotated[
        int,
        typer.Option(
            help="Keep passages graded at least this (5 essential ... 1 unrelated).",
            rich_help_panel=_PRUNE,
        ),
    ] = 3,
    prune_keep_top_k: Annotated[
        int,
        typer.Option(help="Always keep this many best-ranked passages.", rich_help_panel=_PRUNE),
    ] = 2,
    warm: Annotated[
        bool, typer.Option(help="Warm each upstream with the plan's prefix as it joins.")
    ] = True,
    watch_plan: Annotated[
        bool,
        typer.Option(
            "--watch-plan",
            help=f"Reload --plan when its content changes (checked every "
            f"{WATCH_PLAN_INTERVAL_S:g} s), as SIGHUP does.",
        ),
    ] = False,
    health_interval: Annotated[
        float, typer.Option(help="Seconds between upstream health checks.")
    ] = 5.0,
    request_timeout: Annotated[
        float, typer.Option(help="Seconds one upstream request may take.")
    ] = 600.0,
    max_body_bytes: Annotated[
        int, typer.Option(help="Largest request body (413 beyond).", rich_help_panel=_SAFE)
    ] = _default("max_body_bytes"),
    max_question_chars: Annotated[
        int,
        typer.Option(
            help="Characters of the question used for retrieval and the query log (a longer "
            "question is still answered whole).",
            rich_help_panel=_SAFE,
        ),
    ] = _default("max_question_chars"),
    max_concurrent: Annotated[
        int,
        typer.Option(
            help="Generation requests in flight, streams included (429 beyond).",
            rich_help_panel=_SAFE,
        ),
    ] = _default("max_concurrent"),
    header_timeout: Annotated[
        float,
        typer.Option(
            help="Seconds a connection may take to send its request line and headers.",
            rich_help_panel=_SAFE,
        ),
    ] = _default("header_timeout_s"),
    body_timeout: Annotated[
        float,
        typer.Option(help="Seconds a request body may take (408 beyond).", rich_help_panel=_SAFE),
    ] = _default("body_timeout_s"),
    allow_origin: Annotated[
        list[str] | None,
        typer.Option(
            help="Browser origin let in, e.g. https://app.example (repeatable; requests "
            "carrying any other Origin get 403).",
            rich_help_panel=_SAFE,
        ),
    ] = None,
    allow_host: Annotated[
        list[str] | None,
        typer.Option(
            help="Host header name accepted besides --host (repeatable; e.g. behind a proxy).",
            rich_help_panel=_SAFE,
        ),
    ] = None,
    allow_prompt_readback: Annotated[
        bool,
        typer.Option(
            "--allow-prompt-readback",
            help="Pass echo, prompt_logprobs, return_token_ids and return_tokens_as_token_ids "
            "on: they return the hidden prompt (prefix and retrieved passages).",
            rich_help_panel=_SAFE,
        ),
    ] = False,
    qdrant: QdrantLocation = None,
    collection: QdrantCollection = None,
    qdrant_api_key: QdrantApiKey = None,
    qdrant_fusion: QdrantFusion = DEFAULT_FUSION,
) -> None:
    """Serve /v1/chat/completions and /v1/completions with the resident prefix first.

    SIGHUP (or --watch-plan) reloads --plan without downtime: the new plan is validated and its
    prefixes warmed on every upstream before new requests use it; requests in flight finish on
    the old one; a plan that fails is refused in one log line and the old plan keeps serving.
    """
    if retriever not in ("hybrid", "bm25", "dense", "qdrant"):
        raise ConfigError(f"--retriever {retriever!r}: choose hybrid, bm25, dense or qdrant")
    qdrant_settings = qdrant_options(retriever, qdrant, collection, qdrant_api_key, qdrant_fusion)
    try:
        day = dt.date.fromisoformat(today) if today else None
    except ValueError:
        raise ConfigError(f"--today {today!r}: expected YYYY-MM-DD") from None
    retriever_name: RetrieverName = retriever  # type: ignore[assignment]
    settings = ServeSettings(
        plan=plan,
        index=index,
        upstreams=tuple(upstream or ("http://127.0.0.1:8000",)),
        host=host,
        port=port,
        api_key=api_key,
        upstream_api_key=upstream_api_key,
        log=None if no_log else (log or plan.parent / "query-log.jsonl"),
        k=k,
        margin=margin,
        hedge=hedge,
        retriever=retriever_name,
        qdrant=qdrant_settings,
        today=day,
        max_dated=max_dated,
        pruner=PrunerOptions(
            url=pruner_url,
            model=pruner_model,
            threshold=prune_threshold,
            keep_top_k=prune_keep_top_k,
        ),
        warm=warm,
        watch_plan=watch_plan,
        health_interval_s=health_interval,
        request_timeout_s=request_timeout,
        limits=RequestLimits(
            max_body_bytes=max_body_bytes,
            max_question_chars=max_question_chars,
            max_concurrent=max_concurrent,
            header_timeout_s=header_timeout,
            body_timeout_s=body_timeout,
        ),
        allow_origins=tuple(allow_origin or ()),
        allow_hosts=tuple(allow_host or ()),
        allow_prompt_readback=allow_prompt_readback,
    )
    from residency.serve.run import run_server  # the router's imports load only when serving

    run_server(settings)
