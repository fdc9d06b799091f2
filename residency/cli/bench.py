"""`residency bench`: cold vs warm TTFT per prompt length on a running vLLM (table, JSON, plot)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from pydantic import BaseModel, ConfigDict, Field, model_validator
from rich.console import Console
from rich.markup import escape

from residency.atomic import check_output_file
from residency.bench.options import BenchOptions
from residency.cli.spec import command
from residency.flags import JsonOutput, Questions, Section

if TYPE_CHECKING:
    from residency.bench.report import BenchReport
    from residency.stats import TimingStats


class BenchArgs(BaseModel):
    """`residency bench`'s options."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    options: Annotated[
        BenchOptions, Section(skip=frozenset({"max_sightings", "request_timeout_s", "text_dir"}))
    ] = Field(description="What to measure and where.")
    plan: Path | None = Field(
        default=None,
        description="plan.json: its prefix is the prompt text, and one row is its prefix.",
    )
    questions: Questions = None  # with --plan: coverage vs budget
    plot: Path | None = Field(
        default=None, description="Write a PNG: TTFT vs length (+ coverage vs budget)."
    )
    json_output: JsonOutput = False

    @model_validator(mode="after")
    def _questions_need_a_plan(self) -> BenchArgs:
        if self.questions is not None and self.plan is None:
            raise ValueError("--questions draws coverage vs budget for a plan: pass --plan too")
        return self


@command(BenchArgs)
def bench(args: BenchArgs) -> None:
    """Measure cold (never-seen prefix) and warm (cached) TTFT per prompt length on a server."""
    from rich.progress import Progress

    from residency.bench.coverage_curve import coverage_vs_budget
    from residency.bench.plot import plot_bench
    from residency.bench.report import dump_report
    from residency.bench.ttft import run_bench
    from residency.cli.progress import BarProgress
    from residency.planning.plan_model import read_plan

    options, questions, plot, json = args.options, args.questions, args.plot, args.json_output
    if plot is not None:
        check_output_file(plot, "--plot")
    residency_plan = read_plan(args.plan) if args.plan is not None else None
    err = Console(stderr=True, soft_wrap=True)
    with Progress(console=err, transient=True, disable=json) as bar:
        progress = BarProgress(bar)
        report = run_bench(options, residency_plan, progress)
        if residency_plan is not None and questions is not None:
            curve = coverage_vs_budget(residency_plan, questions, progress=progress)
            report = report.model_copy(update={"coverage": curve})
    if plot is not None:
        plot_bench(report, plot)
    if json:
        typer.echo(dump_report(report))
        return
    render(report, Console(soft_wrap=True))
    if plot is not None:
        Console(soft_wrap=True).print(f"plot: {escape(str(plot))}")


def _spread(stats: TimingStats) -> str:
    return f"{stats.median_s:.3f} ({stats.p10_s:.3f}-{stats.p90_s:.3f})"


def render(report: BenchReport, console: Console) -> None:
    """The TTFT table (medians, p10-p90), the cache evidence, coverage and warnings."""
    from rich.table import Table

    table = Table(
        title=f"TTFT on {escape(report.served_model)} at {report.server} "
        f"(block {report.block_size}, max_model_len {report.max_model_len:,})",
        title_justify="left",
    )
    for name in ("length", "tokens", "cold s (p10-p90)", "warm s (p10-p90)", "warm/cold"):
        table.add_column(name, justify="right")
    table.add_column("cold cached", justify="right")
    table.add_column("warm cached / expected", justify="right")
    for row in report.results:
        ratio = f"{row.warm_over_cold:.3f}" if row.warm_over_cold is not None else "-"
        cold_cached = f"{max(row.cold_cached_tokens):,}" + ("" if row.cold_verified else " !")
        warm_cached = f"{min(row.warm_cached_tokens):,} / {row.expected_cached_tokens:,}"
        table.add_row(
            row.label,
            f"{row.prompt_tokens:,}",
            _spread(row.cold),
            _spread(row.warm),
            ratio,
            cold_cached,
            warm_cached + ("" if row.warm_resident else " !"),
        )
    console.print(table)
    console.print(
        f"[dim]{report.cold_repeats} cold send(s) per length, each salted so no block can match; "
        f"{report.repeats} timed warm send(s) after admission; text: {escape(report.text_source)}; "
        f"cached tokens from {report.cached_source}; {report.ttft_method}[/]",
        highlight=False,
    )
    if report.coverage is not None:
        curve = report.coverage
        best: dict[str, float] = {}
        for p in curve.points:
            if p.budget_tokens == max(q.budget_tokens for q in curve.points):
                best[p.strategy] = p.coverage
        shares = ", ".join(f"{name} {cov:.3f}" for name, cov in best.items())
        console.print(
            f"coverage at {max(p.budget_tokens for p in curve.points):,} tokens on "
            f"{curve.questions} questions: {shares}",
            highlight=False,
        )
    for warning in report.warnings:
        console.print(f"[yellow]warning:[/] {escape(warning)}")
