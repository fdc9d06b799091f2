"""`residency demo`: build, start, plan, warm, serve, measure and stop, in one command (no GPU)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer
from pydantic import BaseModel, ConfigDict, Field
from rich.console import Console
from rich.markup import escape

from residency.cli.spec import command
from residency.demo.options import DemoOptions
from residency.flags import JsonOutput, Section

if TYPE_CHECKING:
    from residency.demo.report import DemoReport


class DemoArgs(BaseModel):
    """`residency demo`'s options."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    options: Annotated[
        DemoOptions,
        Section(skip=frozenset({"cache_dir", "kv_cache_space_gib", "today", "startup_timeout_s"})),
    ] = Field(default_factory=DemoOptions, description="What the demo runs.")
    json_output: JsonOutput = False


@command(DemoArgs)
def demo(args: DemoArgs) -> None:
    """Build a local model, start vLLM's CPU server, plan, warm, ask through the router (real
    answers), compare cold and warm TTFT, draw the picture, then stop everything it started."""
    import orjson

    from residency.demo.run import run_demo
    from residency.demo.servers import Terminated

    json = args.json_output
    steps = Console(stderr=json, soft_wrap=True, highlight=False)
    try:
        report = run_demo(args.options, lambda line: steps.print(escape(line)))
    except Terminated as exc:
        Console(stderr=True).print(f"{exc}: every server the demo started is stopped")
        raise typer.Exit(128 + exc.signum) from None
    if json:
        typer.echo(orjson.dumps(report.model_dump(mode="json"), option=orjson.OPT_INDENT_2))
        return
    console = Console(soft_wrap=True)
    if not console.is_terminal:  # a pipe or file gets 80 columns: too few for the tables
        console.width = 120
    render(report, console)


def _prefixes(report: DemoReport) -> str:
    """' in 2 prefixes (9,472 of 45,301 corpus tokens, 21%)', or '' for one prefix."""
    resident = report.resident_corpus_tokens
    if len(report.prefix_tokens_by_id) < 2 or not report.corpus_tokens or resident is None:
        return ""
    return (
        f" in {len(report.prefix_tokens_by_id)} prefixes ({resident:,} of "
        f"{report.corpus_tokens:,} corpus tokens, {resident / report.corpus_tokens:.0%})"
    )


def render(report: DemoReport, console: Console) -> None:
    """The machine, the questions with their answers, the TTFT table, the artefacts, and the
    servers if kept up."""
    from rich.table import Table

    from residency.cli.bench import render as render_bench

    console.print(f"[bold]machine[/]: {escape(report.machine.describe())}", highlight=False)
    console.print(
        f"[bold]model[/]: {escape(report.served_model)} ({report.model}, "
        f"{report.dtype.dtype}); "
        f"[bold]plan[/]: {report.resident_sections} of {report.total_sections} sections of "
        f"{escape(report.sample)} resident{_prefixes(report)}, prefix {report.prefix_tokens:,} "
        f"of {report.resident_budget_tokens:,} budget tokens; warm: "
        f"{report.warm.cached_tokens:,} cached, TTFT {report.warm.cold_ttft_s:.2f} s → "
        f"{report.warm.warm_ttft_s:.2f} s",
        highlight=False,
    )
    table = Table(title="Questions through the router", title_justify="left")
    table.add_column("question", max_width=28, overflow="fold")
    table.add_column("route", no_wrap=True)
    table.add_column("prefix", no_wrap=True)
    table.add_column("retrieved (sections)", max_width=30, overflow="fold")
    table.add_column("answer", max_width=40, overflow="fold")
    for name in ("prompt", "cached", "TTFT s"):
        table.add_column(name, justify="right")
    for q in report.questions:
        table.add_row(
            escape(q.question),
            q.route,
            q.prefix or "-",
            escape("\n".join(q.retrieved)) or "-",
            escape(" ".join(q.answer.split())) or "-",
            f"{q.prompt_tokens:,}",
            f"{q.cached_tokens:,}" if q.cached_tokens is not None else "-",
            f"{q.ttft_s:.3f}",
        )
    console.print(table)
    for line in report.scaled_down:
        console.print(f"scaled down: {escape(line)}", highlight=False)
    if report.bench is not None:
        render_bench(report.bench, console)
    picture = f"picture: {escape(report.plot_path)}; " if report.plot_path else ""
    console.print(
        f"{picture}report: {escape(report.out_dir)}/demo.json; total {report.total_s:.0f} s "
        f"of a {report.time_budget_s:.0f} s budget",
        highlight=False,
    )
    if report.kept_running:
        for server in report.servers:
            console.print(
                f"{server.name} still running at {server.url} (stop: kill -TERM -- -{server.pgid})",
                highlight=False,
            )
