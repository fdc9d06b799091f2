"""`residency plan`: KV-cache capacity and the resident budget for a host."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import typer
from rich.console import Console
from rich.markup import escape

from planner import CacheSettings, Reserves
from planner.kv_layout import Platform
from planner.units import DTypeFlag, KVCacheDType, MambaDType
from residency.capacity.request import DEFAULT_MAX_MODEL_LEN, CapacityRequest
from residency.cli.fields import bind, default_of, option_from
from residency.cli.options import DEFAULT_SAMPLE_NAME, JsonOption, SampleOption
from residency.cli.output import echo_json
from residency.cli.qdrant_options import (
    DEFAULT_FUSION,
    QdrantApiKey,
    QdrantCollection,
    QdrantFusion,
    QdrantLocation,
    qdrant_backend,
)
from residency.planning.plan_model import PlanSettings, Strategy

_HOST = "Host (pick one: --profile, --gpu auto, --kv-cache-memory-bytes, --server)"
_VLLM = "vLLM flags"
_RES = "Per-request reserves"
_PLAN = "Residency"


def plan(
    model: Annotated[
        str | None, option_from(CapacityRequest, "model", rich_help_panel=_HOST)
    ] = default_of(CapacityRequest, "model"),
    profile: Annotated[
        str | None, option_from(CapacityRequest, "profile", rich_help_panel=_HOST)
    ] = default_of(CapacityRequest, "profile"),
    gpu: Annotated[
        Literal["auto"] | None, option_from(CapacityRequest, "gpu", rich_help_panel=_HOST)
    ] = default_of(CapacityRequest, "gpu"),
    server: Annotated[
        str | None, option_from(CapacityRequest, "server", rich_help_panel=_HOST)
    ] = default_of(CapacityRequest, "server"),
    gpu_index: Annotated[
        int, option_from(CapacityRequest, "gpu_index", rich_help_panel=_HOST)
    ] = default_of(CapacityRequest, "gpu_index"),
    tensor_parallel_size: Annotated[
        int,
        option_from(
            CacheSettings,
            "tensor_parallel_size",
            "--tensor-parallel-size",
            "-tp",
            rich_help_panel=_VLLM,
        ),
    ] = default_of(CacheSettings, "tensor_parallel_size"),
    pipeline_parallel_size: Annotated[
        int,
        option_from(
            CacheSettings,
            "pipeline_parallel_size",
            "--pipeline-parallel-size",
            "-pp",
            rich_help_panel=_VLLM,
        ),
    ] = default_of(CacheSettings, "pipeline_parallel_size"),
    platform: Annotated[
        Platform, option_from(CacheSettings, "platform", rich_help_panel=_VLLM)
    ] = default_of(CacheSettings, "platform"),
    max_model_len: Annotated[
        int, option_from(CacheSettings, "max_model_len", rich_help_panel=_VLLM)
    ] = DEFAULT_MAX_MODEL_LEN,
    gpu_memory_utilization: Annotated[
        float, option_from(CapacityRequest, "gpu_memory_utilization", rich_help_panel=_VLLM)
    ] = default_of(CapacityRequest, "gpu_memory_utilization"),
    kv_cache_memory_bytes: Annotated[
        int | None, option_from(CapacityRequest, "kv_cache_memory_bytes", rich_help_panel=_VLLM)
    ] = default_of(CapacityRequest, "kv_cache_memory_bytes"),
    kv_cache_dtype: Annotated[
        KVCacheDType, option_from(CacheSettings, "kv_cache_dtype", rich_help_panel=_VLLM)
    ] = default_of(CacheSettings, "kv_cache_dtype"),
    block_size: Annotated[
        int | None, option_from(CacheSettings, "block_size", rich_help_panel=_VLLM)
    ] = default_of(CacheSettings, "block_size"),
    dtype: Annotated[
        DTypeFlag, option_from(CacheSettings, "dtype", rich_help_panel=_VLLM)
    ] = default_of(CacheSettings, "dtype"),
    enable_prefix_caching: Annotated[
        bool, option_from(CacheSettings, "enable_prefix_caching", rich_help_panel=_VLLM)
    ] = default_of(CacheSettings, "enable_prefix_caching"),
    mamba_cache_dtype: Annotated[
        MambaDType, option_from(CacheSettings, "mamba_cache_dtype", rich_help_panel=_VLLM)
    ] = default_of(CacheSettings, "mamba_cache_dtype"),
    mamba_ssm_cache_dtype: Annotated[
        MambaDType, option_from(CacheSettings, "mamba_ssm_cache_dtype", rich_help_panel=_VLLM)
    ] = default_of(CacheSettings, "mamba_ssm_cache_dtype"),
    cpu_avx512_bf16: Annotated[
        bool | None,
        option_from(
            CapacityRequest,
            "cpu_avx512_bf16",
            "--cpu-avx512-bf16/--no-cpu-avx512-bf16",
            show_default=False,
            rich_help_panel=_VLLM,
        ),
    ] = default_of(CapacityRequest, "cpu_avx512_bf16"),
    max_num_batched_tokens: Annotated[
        int, option_from(CacheSettings, "max_num_batched_tokens", rich_help_panel=_VLLM)
    ] = default_of(CacheSettings, "max_num_batched_tokens"),
    max_num_seqs: Annotated[
        int, option_from(CapacityRequest, "max_num_seqs", rich_help_panel=_VLLM)
    ] = default_of(CapacityRequest, "max_num_seqs"),
    enforce_eager: Annotated[
        bool, option_from(CapacityRequest, "enforce_eager", rich_help_panel=_VLLM)
    ] = default_of(CapacityRequest, "enforce_eager"),
    question_tokens: Annotated[
        int, option_from(Reserves, "question_tokens", "--reserve-question", rich_help_panel=_RES)
    ] = default_of(Reserves, "question_tokens"),
    retrieved_tokens: Annotated[
        int,
        option_from(Reserves, "retrieved_tokens", "--reserve-retrieved", rich_help_panel=_RES),
    ] = default_of(Reserves, "retrieved_tokens"),
    output_tokens: Annotated[
        int, option_from(Reserves, "output_tokens", "--reserve-output", rich_help_panel=_RES)
    ] = default_of(Reserves, "output_tokens"),
    template_tokens: Annotated[
        int, option_from(Reserves, "template_tokens", "--reserve-template", rich_help_panel=_RES)
    ] = default_of(Reserves, "template_tokens"),
    concurrent_requests: Annotated[
        int, option_from(Reserves, "concurrent_requests", "--concurrency", rich_help_panel=_RES)
    ] = default_of(Reserves, "concurrent_requests"),
    index: Annotated[
        Path | None,
        typer.Option(
            help="Index from `residency index` (default: the sample corpus's, built "
            "under the cache directory on first use).",
            rich_help_panel=_PLAN,
        ),
    ] = None,
    sample: SampleOption = DEFAULT_SAMPLE_NAME,
    log: Annotated[
        list[str] | None,
        typer.Option(
            help="Query log (jsonl: query, count, ts); repeatable, and globs (quoted: "
            "'logs/router-*.jsonl') merge several routers' logs by timestamp; none: "
            "density-only planning. Default with the sample corpus: its queries.jsonl.",
            rich_help_panel=_PLAN,
        ),
    ] = None,
    output: Annotated[
        Path,
        typer.Option(
            "--output",
            "-o",
            help="Where plan.json goes (written atomically).",
            rich_help_panel=_PLAN,
        ),
    ] = Path("plan.json"),
    pin: Annotated[
        list[str] | None,
        typer.Option(
            help="Section id that is always resident (repeatable).", rich_help_panel=_PLAN
        ),
    ] = None,
    exclude: Annotated[
        list[str] | None,
        typer.Option(help="Section id that is never resident (repeatable).", rich_help_panel=_PLAN),
    ] = None,
    strategy: Annotated[
        Strategy, option_from(PlanSettings, "strategy", rich_help_panel=_PLAN)
    ] = default_of(PlanSettings, "strategy"),
    prefixes: Annotated[
        int | None,
        option_from(PlanSettings, "prefixes", show_default=False, rich_help_panel=_PLAN),
    ] = default_of(PlanSettings, "prefixes"),
    shared_tokens: Annotated[
        int | None,
        option_from(PlanSettings, "shared_tokens", show_default=False, rich_help_panel=_PLAN),
    ] = default_of(PlanSettings, "shared_tokens"),
    tokenizer_dir: Annotated[
        Path | None,
        typer.Option(
            help="Local tokenizer (tokenizer.json) of the served model for prefix "
            "tokens; --server uses the server's.",
            rich_help_panel=_PLAN,
        ),
    ] = None,
    capacity_only: Annotated[
        bool,
        typer.Option(
            help="Only the capacity and budget; no residency plan.", rich_help_panel=_PLAN
        ),
    ] = False,
    retriever: Annotated[
        Literal["hybrid", "qdrant"],
        typer.Option(
            help="Log attribution: hybrid (the index's own BM25 + dense) or qdrant (the same "
            "fusion over the index's Qdrant collection, --qdrant).",
            rich_help_panel=_PLAN,
        ),
    ] = "hybrid",
    qdrant: QdrantLocation = None,
    collection: QdrantCollection = None,
    qdrant_api_key: QdrantApiKey = None,
    qdrant_fusion: QdrantFusion = DEFAULT_FUSION,
    json: JsonOption = False,
) -> None:
    """Measure the host's KV-cache capacity, derive the resident budget, and choose the resident
    sections (plan.json)."""
    import orjson

    from residency.capacity.report import build_capacity_report
    from residency.cli.plan_report import render, render_plan
    from residency.cli.progress import BarProgress, progress_bar
    from residency.corpus.samples import get_sample
    from residency.planning.plan_model import write_plan
    from residency.planning.run import PlanJob, run_plan

    params = locals()
    request = bind(
        CapacityRequest,
        params,
        # the tri-state --cpu-avx512-bf16 is the request's; report.py resolves the cache's
        cache=bind(CacheSettings, params, cpu_avx512_bf16=False),
        reserves=bind(Reserves, params),
    )
    if capacity_only:
        report = build_capacity_report(request)
        if json:
            echo_json(report)
        else:
            render(report, Console())
        return
    backend = qdrant_backend(retriever, qdrant, collection, qdrant_api_key, qdrant_fusion)
    job = PlanJob(
        capacity=request,
        index_dir=index,
        sample=get_sample(sample),
        logs=tuple(log or ()),
        backend=backend,
        tokenizer_dir=tokenizer_dir,
        settings=bind(PlanSettings, params),
        pins=tuple(pin or ()),
        excludes=tuple(exclude or ()),
    )
    with progress_bar(False, eta=True, terminal_only=False) as bar:
        report, plan = run_plan(job, BarProgress(bar))
    err = bar.console
    write_plan(plan, output)
    for warning in job.warnings:
        err.print(f"[yellow]warning:[/] {escape(warning)}")
    if json:
        body = report.model_dump(mode="json")
        body["plan_path"] = str(output)
        texts: dict[str, Any] = {"prefix": {"text"}, "prefixes": {"__all__": {"prefix": {"text"}}}}
        body["plan"] = plan.model_dump(mode="json", exclude=texts)
        typer.echo(orjson.dumps(body, option=orjson.OPT_INDENT_2))
        return
    console = Console()
    render(report, console)
    render_plan(plan, output, console)
