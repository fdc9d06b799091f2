"""`residency demo`: build, start, plan, warm, serve, measure and stop, in one command (no GPU)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.markup import escape

from residency.cli.bench import parse_lengths
from residency.cli.fields import bind, default_of, option_from
from residency.cpu_dtype import CpuDtypeFlag
from residency.demo.options import DemoModel, DemoOptions

if TYPE_CHECKING:
    from residency.demo.report import DemoReport


D = DemoOptions
# Comma-separated text, parsed into the field's tuple: a plain option with the field's help.
_LENGTHS = D.model_fields["lengths"]


def demo(
    out_dir: Annotated[Path, option_from(D, "out_dir", "--out")] = default_of(D, "out_dir"),
    model: Annotated[
        DemoModel | None,
        option_from(D, "model", show_default=False),
    ] = default_of(D, "model"),
    time_budget_s: Annotated[float, option_from(D, "time_budget_s", "--time-budget")] = (
        default_of(D, "time_budget_s")
    ),
    lengths: Annotated[
        str | None,
        typer.Option(help=_LENGTHS.description, show_default=False),
    ] = None,
    repeats: Annotated[int, option_from(D, "repeats")] = default_of(D, "repeats"),
    cold_repeats: Annotated[int, option_from(D, "cold_repeats")] = default_of(D, "cold_repeats"),
    dtype: Annotated[CpuDtypeFlag, option_from(D, "dtype")] = default_of(D, "dtype"),
    python: Annotated[Path, option_from(D, "python", show_default=False)] = default_of(D, "python"),
    keep_running: Annotated[bool, option_from(D, "keep_running", "--keep-running")] = (
        default_of(D, "keep_running")
    ),
    json: Annotated[
        bool, typer.Option("--json", help="Print only demo.json's object (steps on stderr).")
    ] = False,
) -> None:
    """Build a local model, start vLLM's CPU server, plan, warm, ask through the router (real
    answers), compare cold and warm TTFT, draw the picture, then stop everything it started."""
    import orjson

    from residency.demo.run import run_demo
    from residency.demo.servers import Terminated

    parsed = parse_lengths(lengths) if lengths is not None else None
    options = bind(DemoOptions, locals(), lengths=parsed)
    steps = Console(stderr=json, soft_wrap=True, highlight=False)
    try:
        report = run_demo(options, lambda line: steps.print(escape(line)))
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
