"""How `residency plan` prints for people: the capacity report (memory, layout, budget, vLLM's
own numbers beside the prediction) and the residency plan."""

from __future__ import annotations

import textwrap
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from planner.memory import GpuMemoryEstimate
from planner.units import GiB
from residency.capacity.report import CapacityReport, ServerComparison
from residency.planning.plan_model import ResidencyPlan


def render_plan(plan: ResidencyPlan, path: Path, console: Console) -> None:
    """The resident set, the prefix and the predicted coverage (a table per prefix when there
    are several, then one line of KV arithmetic)."""
    if len(plan.prefixes) > 1:
        _render_prefixes(plan, path, console)
        return
    _render_single(plan, path, console)
    if plan.arithmetic is not None:
        console.print(describe_arithmetic(plan))


def describe_tokenizer(plan: ResidencyPlan) -> str:
    """Which tokenizer counted and hashed the prefix (a prefix is cached only if the served
    model tokenizes it to the same ids: `residency warm` checks the hash on the server)."""
    prefix = plan.prefix
    if prefix.hash_of != "token_ids":
        return (
            f"prefix tokens approximate ({prefix.tokenizer}), hashed over its text: pass --server "
            "or --tokenizer-dir for the served model's exact count and hash"
        )
    return f"prefix counted and hashed with {prefix.tokenizer}"


def describe_arithmetic(plan: ResidencyPlan) -> str:
    """'KV 46,592 tokens = 4 prefixes 32,768 resident + 13,824 headroom (...)'."""
    a = plan.arithmetic
    if a is None:
        return ""
    return (
        f"KV cache {a.kv_cache_tokens:,} tokens: {len(plan.all_prefixes())} prefix(es) hold "
        f"{a.resident_kv_tokens:,} (whole blocks"
        + (f"; a shared head of {a.shared_kv_tokens:,} once" if a.shared_kv_tokens else "")
        + f"), headroom {a.headroom_tokens:,} = "
        f"{a.concurrency_left} concurrent request(s) of {a.per_request_kv_tokens:,} tokens "
        f"(--concurrency {a.concurrency_requested}); prefix count {a.prefixes_chosen_by}, "
        f"window {a.window_tokens:,}"
        + (
            f"; hybrid block pool {a.pool_blocks:,}: prefixes hold {a.resident_blocks:,} "
            f"blocks, a request {a.per_request_blocks:,}"
            if a.pool_blocks is not None
            else ""
        )
    )


def _render_prefixes(plan: ResidencyPlan, path: Path, console: Console) -> None:
    """The shared head once, then one row per prefix with the sections only it holds: each
    question is routed to one prefix, so the branches' traffic shares add up (the head's is in
    every prefix and is shown once)."""
    head = set.intersection(*(set(p.section_ids) for p in plan.prefixes))
    head_items = {i.id: i for p in plan.prefixes for i in p.resident if i.section_id in head}
    head_share = sum(i.probability for i in head_items.values())
    if head_items:
        table = Table(
            title=f"Shared head, in every prefix: {len(head)} sections, "
            f"{sum(i.tokens for i in head_items.values()):,} tokens, expected traffic "
            f"{head_share:.1%}",
            title_justify="left",
        )
        table.add_column("id", max_width=48, overflow="ellipsis", no_wrap=True)
        table.add_column("tokens", justify="right")
        table.add_column("p(s)", justify="right")
        shown = sorted(head_items.values(), key=lambda r: -r.probability)[:8]
        for item in shown:
            pinned = " (pinned)" if item.pinned else ""
            table.add_row(item.id + pinned, f"{item.tokens:,}", f"{item.probability:.3f}")
        if len(head_items) > len(shown):
            table.add_row(f"... {len(head_items) - len(shown)} more", "", "")
        console.print(table)
    branches = Table(
        title=f"{len(plan.prefixes)} prefixes: the sections each holds besides the head",
        title_justify="left",
    )
    branches.add_column("prefix")
    for name in ("tokens", "own sections", "own traffic"):
        branches.add_column(name, justify="right")
    branches.add_column("busiest own sections", max_width=44, overflow="ellipsis", no_wrap=True)
    branch_total = 0.0
    for p in plan.prefixes:
        own = [i for i in p.resident if i.section_id not in head]
        share = sum(i.probability for i in own)
        branch_total += share
        busiest = ", ".join(i.id for i in sorted(own, key=lambda r: -r.probability)[:2])
        branches.add_row(
            p.id, f"{p.tokens:,}", str(len({i.section_id for i in own})), f"{share:.1%}", busiest
        )
    console.print(branches)
    cov = plan.coverage
    console.print(
        f"[bold]{cov.resident_sections} of {cov.total_sections} sections resident in "
        f"{len(plan.prefixes)} prefixes[/] ({plan.selection_method}); predicted share of "
        f"questions answered from a prefix: {cov.resident_share:.1%} (head {head_share:.1%} + "
        f"branches {branch_total:.1%})"
    )
    console.print(describe_arithmetic(plan))
    console.print(
        f"log: {plan.log.total_count} questions{plan.log.describe_files()}; written to {path}"
    )
    console.print(describe_tokenizer(plan))


def _render_single(plan: ResidencyPlan, path: Path, console: Console) -> None:
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


def _render_devices(report: CapacityReport, console: Console) -> None:
    """Every visible device (NVML), the ones the plan uses marked."""
    used = set(report.inputs.used_devices)
    table = Table(title="Visible GPUs (NVML, CUDA_VISIBLE_DEVICES applied)", title_justify="left")
    for column in ("cuda", "nvml", "name", "total", "free", "used"):
        table.add_column(column, justify="right" if column in ("total", "free") else "left")
    for g in report.inputs.devices:
        table.add_row(
            str(g.index),
            str(g.nvml_index),
            g.name,
            _gib(g.total_memory_bytes),
            _gib(g.free_memory_bytes),
            "yes" if g.index in used else "",
        )
    console.print(table)


def _render_ranks(report: CapacityReport, console: Console) -> None:
    """Per pipeline stage: one rank's weights, activation and KV bytes, and its blocks."""
    table = Table(title="Per rank (every TP rank of a stage alike)", title_justify="left")
    for column in ("stage", "layers", "requested", "weights", "activation", "KV cache", "blocks"):
        table.add_column(column, justify="left" if column in ("stage", "layers") else "right")
    stage_blocks = report.plan.capacity.stage_num_blocks
    for i, rank in enumerate(report.ranks):
        layers = f"{rank.layers[0]}-{rank.layers[1] - 1}" if rank.layers else "all"
        table.add_row(
            str(rank.pipeline_stage),
            layers,
            _gib(rank.requested_memory_bytes),
            _gib(rank.terms[0].bytes),
            _gib(rank.terms[1].bytes),
            _gib(rank.kv_cache_memory_bytes),
            f"{stage_blocks[i]:,}" if i < len(stage_blocks) else "",
        )
    console.print(table)
    console.print("vLLM gives every rank the smallest rank's block count.")


def _render_memory(report: CapacityReport, memory: GpuMemoryEstimate, console: Console) -> None:
    """The GPU memory terms that leave the KV cache."""
    lay = report.plan.layout
    title = "GPU memory"
    if lay.tensor_parallel_size * lay.pipeline_parallel_size > 1:
        stage = memory.pipeline_stage
        title += f" per rank (stage {stage}, the one that sets the blocks)"
    mem = Table(title=title, title_justify="left")
    mem.add_column("term", min_width=22)
    mem.add_column("GiB", justify="right", no_wrap=True)
    mem.add_column("±", justify="right", no_wrap=True)
    mem.add_column("source")
    mem.add_row(
        f"total x {memory.gpu_memory_utilization}",
        _gib(memory.requested_memory_bytes),
        "",
        "profile / NVML",
    )
    for term in memory.terms:
        source = textwrap.shorten(term.source, 60, placeholder=" …")
        mem.add_row(f"- {term.name}", _gib(term.bytes), _gib(term.uncertainty_bytes), source)
    mem.add_row(
        "[bold]= KV cache[/]",
        _gib(memory.kv_cache_memory_bytes),
        _gib(memory.kv_cache_memory_bytes_high - memory.kv_cache_memory_bytes),
        "",
    )
    console.print(mem)


def _render_kv(report: CapacityReport, console: Console) -> None:
    """The KV cache's layout, size in blocks and tokens, and concurrency."""
    inp, lay = report.inputs, report.plan.layout
    kv = Table(title="KV cache", title_justify="left", show_header=False)
    kv.add_column("what")
    kv.add_column("value", justify="right")
    kv.add_row("KV dtype", lay.kv_cache_dtype)
    if lay.tensor_parallel_size * lay.pipeline_parallel_size > 1:
        kv.add_row(
            "tensor x pipeline parallel",
            f"{lay.tensor_parallel_size} x {lay.pipeline_parallel_size}",
        )
        kv.add_row("KV heads per rank", str(lay.num_kv_heads_per_rank))
    per = " per rank" if lay.tensor_parallel_size > 1 else ""
    kv.add_row(f"KV bytes per token (attention layers{per})", f"{report.kv_bytes_per_token:,}")
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


def _render_server(report: CapacityReport, srv: ServerComparison, console: Console) -> None:
    """vLLM's own numbers beside the planner's, and whether they agree."""
    inp = report.inputs
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
    settings = inp.settings
    read = f"--platform {settings.platform} and --dtype {settings.dtype} read from its numbers"
    if srv.agrees:
        console.print(f"[green]planner agrees with vLLM[/] ({read})", highlight=False)
    else:
        differ = [
            f"{name} {ours:,} (planner) vs {theirs:,} (vLLM)"
            for name, ours, theirs in (
                ("block_size", srv.predicted_block_size, srv.block_size),
                ("num_gpu_blocks", srv.predicted_num_blocks, srv.num_blocks),
                ("kv_cache_size_tokens", srv.predicted_kv_cache_tokens, srv.kv_cache_tokens),
            )
            if ours != theirs
        ]
        console.print(
            f"[yellow]planner and vLLM disagree[/]: {'; '.join(differ)}. No --platform or "
            f"--dtype reproduces the server's numbers; the inputs its metrics do not name: "
            f"--tensor-parallel-size {settings.tensor_parallel_size}, "
            f"--pipeline-parallel-size {settings.pipeline_parallel_size}, and the model "
            f"config {escape(inp.model_config_source)}",
            highlight=False,
        )


def render(report: CapacityReport, console: Console) -> None:
    """A readable summary: inputs, memory terms, KV layout, capacity, budget."""
    inp = report.inputs
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
    if inp.devices:
        _render_devices(report, console)
    if report.memory is not None:
        _render_memory(report, report.memory, console)
    if report.ranks:
        _render_ranks(report, console)
    _render_kv(report, console)
    if report.server is not None:
        _render_server(report, report.server, console)
    budget = report.plan.budget
    console.print(
        f"[bold]Resident budget: {report.resident_budget_tokens:,} tokens[/] "
        f"(binding: {report.binding_constraint}) — {budget.reasoning}."
    )
