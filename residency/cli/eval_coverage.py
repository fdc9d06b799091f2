"""`residency eval coverage`: one plan over a questions file, or the simulated comparison of
every strategy on a SQuAD-style file (registered on the `residency eval` app)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from rich.console import Console
from rich.markup import escape

from residency.cli.output import compact_table, echo_json, pct
from residency.cli.spec import command
from residency.errors import ConfigError
from residency.eval.coverage_options import CoverageOptions, TrafficOptions
from residency.eval.defaults import COVERAGE_CACHE, CoverageCacheDir
from residency.flags import JsonOutput, Questions, SquadFile, TokenizerDir

if TYPE_CHECKING:
    from residency.eval.coverage_report import CoverageMetrics, CoverageReport, SeedStat


class CoverageArgs(BaseModel):
    """`residency eval coverage`'s options."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    plan: tuple[Path, ...] = Field(
        default=(),
        max_length=16,
        description="Evaluate this plan.json (with --questions); repeatable: plans of one corpus "
        "side by side (e.g. the default several prefixes and --prefixes 1), beside rag-top-k at "
        "the same k.",
    )
    questions: Questions = None
    squad: SquadFile = None  # simulate its traffic and compare every strategy
    options: CoverageOptions = Field(
        default_factory=CoverageOptions, description="The host, the budget and the routing."
    )
    traffic: TrafficOptions = Field(
        default_factory=TrafficOptions, description="The simulated traffic (--squad)."
    )
    index_dir: Path | None = Field(
        default=None,
        description="Index to use: --plan: instead of the plan's own; --squad: build or reuse "
        "it here (default: under --cache-dir).",
    )
    retriever: Literal["bm25", "hybrid"] = Field(
        default="bm25",
        description="--squad: how every row retrieves: bm25, or hybrid (dense + BM25 fused, "
        "as `residency serve` defaults to; embedding the corpus takes minutes on 2 cores). "
        "--plan uses the plan's index as the router does.",
    )
    cache_dir: CoverageCacheDir = COVERAGE_CACHE
    tokenizer_dir: TokenizerDir = None
    json_output: JsonOutput = False

    @model_validator(mode="after")
    def _one_source(self) -> CoverageArgs:
        if bool(self.plan) == (self.squad is not None):
            raise ValueError(
                "pass either --plan PLAN.json --questions QA.jsonl (evaluate one plan) or "
                "--squad FILE (simulate traffic and compare every strategy)"
            )
        if self.plan and self.questions is None:
            raise ValueError(f"--plan {self.plan[0]} needs --questions QA.jsonl to evaluate on")
        return self


@command(CoverageArgs)
def coverage(args: CoverageArgs) -> None:
    """Share of questions whose gold evidence is resident or routed in, and the tokens it costs."""
    from residency.cli.progress import BarProgress, progress_bar
    from residency.eval.coverage_runs import SimulationJob, evaluate_plan_files, run_simulations

    options, json, plans, squad = args.options, args.json_output, args.plan, args.squad
    bar = progress_bar(json)
    if plans:
        assert args.questions is not None
        with bar:
            report = evaluate_plan_files(
                plans,
                args.questions,
                index_dir=args.index_dir,
                tokenizer_dir=args.tokenizer_dir,
                options=options,
                progress=BarProgress(bar),
            )
    else:
        assert squad is not None
        if options.server is not None:
            options = _host_of(options)
        job = SimulationJob(
            squad_file=squad,
            options=options,
            traffic=args.traffic,
            index_dir=args.index_dir,
            dense=args.retriever == "hybrid",
            cache_dir=args.cache_dir,
        )
        with bar:
            report = run_simulations(job, options.seeds, BarProgress(bar))
    if json:
        echo_json(report)
    else:
        render_coverage(report, Console())


def _host_of(options: CoverageOptions) -> CoverageOptions:
    """`--server`: the modelled host's KV-cache tokens and max_model_len read from it."""
    from residency.vllm_client import VllmClient

    assert options.server is not None
    with VllmClient(options.server, flag="--server") as client:
        length = client.models()[0].max_model_len
        tokens = client.kv_cache_tokens()
    if length is None or tokens is None:
        raise ConfigError(
            f"--server {options.server} does not say its max_model_len (/v1/models) and KV-cache "
            "size (vllm:cache_config_info); give --kv-cache-tokens and --max-model-len"
        )
    return options.model_copy(update={"kv_cache_tokens": tokens, "max_model_len": length})


def _coverage_row(m: CoverageMetrics) -> list[str]:
    return [
        f"{100 * m.coverage:.2f}%",
        f"{100 * m.coverage_all:.2f}%",
        pct(m.resident_share),
        pct(m.long_tail_recall),
    ]


def _cost_row(m: CoverageMetrics) -> list[str]:
    return [
        pct(m.route_resident_share),
        str(m.misrouted),
        f"{m.mean_added_tokens:,.0f}",
        f"{m.mean_uncached_tokens:,.0f}",
        f"{m.mean_prompt_tokens:,.0f}",
    ]


# Two narrow tables rather than one wide one: at 80 columns every strategy name stays whole.
_COVERAGE_COLUMNS = ("coverage", "coverage\nall", "in\nprefix", "long-tail\nrecall")
_COST_COLUMNS = (
    "resident\nroute",
    "mis-\nrouted",
    "added\ntokens",
    "uncached\ntokens",
    "prompt\ntokens",
)


def _pm(stat: SeedStat | None, scale: float = 1.0, unit: str = "", digits: int = 0) -> str:
    if stat is None:
        return "-"
    return f"{scale * stat.mean:,.{digits}f} ± {scale * stat.sd:,.{digits}f}{unit}"


def render_coverage(report: CoverageReport, console: Console) -> None:
    """Settings, simulation, the comparison table and the per-type table."""
    _render_setup(report, console)
    _render_results(report, console)
    if report.across_seeds:
        _render_seeds(report, console)
    _render_by_type(report, console)
    if report.excluded_no_relevant:
        console.print(f"{report.excluded_no_relevant} question(s) without relevant ids excluded")
    if report.unknown_relevant_count:
        console.print(
            f"[yellow]warning:[/] {report.unknown_relevant_count} relevant id(s) are not sections "
            "of this index and always count as misses"
        )
    for note in report.notes:
        console.print(f"note: {escape(note)}", highlight=False)


def _render_setup(report: CoverageReport, console: Console) -> None:
    """What was evaluated: questions, index, routing settings and the simulated traffic."""
    s = report.settings
    retrieval = f"hybrid ({s.embedder} + BM25)" if s.embedder else "BM25-only"
    ks = "/".join(str(k) for k in sorted({r.k for r in report.results}))
    console.print(
        f"[bold]{report.evaluated}[/] questions ({escape(report.questions_source)}); index "
        f"{escape(s.index_dir)}: {retrieval}, chunks {s.chunker}; prefetch {s.prefetch}, "
        f"margin {s.margin}, hedge {s.hedge}, long-tail route adds k={ks} chunks, top "
        f"{s.spread} sections shown, {s.hops} hop(s); added tokens counted with "
        f"{escape(s.tokenizer)}"
        + (f"; budget {s.budget_tokens} tokens" if s.budget_tokens else ""),
        highlight=False,
    )
    t = report.simulation
    if t is not None:
        console.print(
            f"traffic: Zipf over {t.paragraphs} paragraphs (top one {pct(t.top_paragraph_share)}"
            f" of questions); log {t.log_distinct_queries} distinct queries from a pool of "
            f"{t.log_pool_questions}, eval {t.eval_distinct_questions} distinct from a pool of "
            f"{t.eval_pool_questions} (disjoint); {t.paragraphs_without_log_pool} paragraph(s) "
            "never in the log",
            highlight=False,
        )


def _render_results(report: CoverageReport, console: Console) -> None:
    """Coverage and the routing and prompt-token costs, one row per strategy."""
    table = compact_table(
        "Coverage",
        ("strategy",),
        (*_COVERAGE_COLUMNS, "rag-top5\nmisses\nrescued", "resident\nsections"),
    )
    cost = compact_table("Routing and prompt tokens per question", ("strategy",), _COST_COLUMNS)
    for r in report.results:
        rescued = pct(r.rag_misses_rescued)
        table.add_row(r.name, *_coverage_row(r.overall), rescued, str(r.resident_sections))
        cost.add_row(r.name, *_cost_row(r.overall))
    console.print(table)
    console.print(cost)


def _render_seeds(report: CoverageReport, console: Console) -> None:
    """Coverage and tokens as mean ± sd across the traffic seeds."""
    n = report.across_seeds[0].seeds
    seeds = compact_table(
        f"Across {n} traffic seeds (mean ± sd)",
        ("strategy",),
        ("coverage", "coverage\nall", "in\nprefix", "rag-top5\nmisses\nrescued"),
    )
    tokens = compact_table(
        f"Tokens per question across {n} seeds (mean ± sd)",
        ("strategy",),
        ("added", "uncached", "prompt"),
    )
    for row in report.across_seeds:
        seeds.add_row(
            row.name,
            _pm(row.coverage, 100, "%", 2),
            _pm(row.coverage_all, 100, "%", 2),
            _pm(row.resident_share, 100, "%", 1),
            _pm(row.rag_misses_rescued, 100, "%"),
        )
        tokens.add_row(
            row.name,
            _pm(row.mean_added_tokens),
            _pm(row.mean_uncached_tokens),
            _pm(row.mean_prompt_tokens),
        )
    console.print(seeds)
    console.print(tokens)


def _render_by_type(report: CoverageReport, console: Console) -> None:
    """Coverage and tokens per question type, where there are several types."""
    types = sorted({t for r in report.results for t in r.by_type})
    if len(types) <= 1:
        return
    by_type = compact_table(
        "By question type",
        ("type", "strategy", "n"),
        (*_COVERAGE_COLUMNS[:3], "added\ntokens", "uncached\ntokens"),
    )
    for qt in types:
        for r in report.results:
            if qt in r.by_type:
                m = r.by_type[qt]
                by_type.add_row(
                    escape(qt),
                    r.name,
                    str(m.questions),
                    *_coverage_row(m)[:3],
                    f"{m.mean_added_tokens:,.0f}",
                    f"{m.mean_uncached_tokens:,.0f}",
                )
    console.print(by_type)
