"""`residency eval prune`: context the listwise pruner removes on a SQuAD-style file or a
question set with gold section ids, and the gold evidence it keeps (registered on the
`residency eval` app)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from residency.cli.fields import bind, check_fields, default_of, option_from
from residency.cli.options import DEFAULT_SAMPLE_NAME, JsonOption, SampleOption
from residency.cli.output import echo_json, pct
from residency.errors import ConfigError
from residency.eval.defaults import COVERAGE_CACHE
from residency.eval.prune_report import PruneEvalReport, PruneEvalSettings
from residency.serve.pruner_settings import PrunerSettings

P = PrunerSettings


def prune(
    url: Annotated[str, option_from(P, "url", "--pruner-url")],
    model: Annotated[str, option_from(P, "model", "--pruner-model")] = default_of(P, "model"),
    squad: Annotated[
        Path | None,
        typer.Option(
            help="SQuAD-style JSON, e.g. ../shared/data/jsquad/valid-v1.3.json (imported and "
            "indexed under --cache-dir); without it: --questions over --index."
        ),
    ] = None,
    questions: Annotated[
        Path | None,
        typer.Option(
            help="jsonl with gold section ids (id, query, relevant_ids) when no --squad is given.",
            show_default="the --sample corpus's qa.jsonl",
        ),
    ] = None,
    index: Annotated[
        Path | None,
        typer.Option(
            "--index",
            help="Index the --questions' chunks come from (default: the --sample corpus's).",
        ),
    ] = None,
    sample: SampleOption = DEFAULT_SAMPLE_NAME,
    threshold: Annotated[int, option_from(P, "threshold", "--threshold")] = default_of(
        P, "threshold"
    ),
    keep_top_k: Annotated[int, option_from(P, "keep_top_k", "--keep-top-k")] = default_of(
        P, "keep_top_k"
    ),
    k: Annotated[int, option_from(PruneEvalSettings, "k", "--k")] = default_of(
        PruneEvalSettings, "k"
    ),
    limit: Annotated[int, option_from(PruneEvalSettings, "limit", "--limit")] = default_of(
        PruneEvalSettings, "limit"
    ),
    timeout_s: Annotated[float, option_from(P, "timeout_s", "--timeout")] = default_of(
        P, "timeout_s"
    ),
    cache_dir: Annotated[
        Path,
        typer.Option(
            help="Where the imported corpus and its BM25 index are kept (shared with "
            "`eval coverage`).",
            show_default="CACHE/coverage",
        ),
    ] = COVERAGE_CACHE,
    json: JsonOption = False,
) -> None:
    """Share of retrieved chunks the pruner removes, gold evidence kept, and the latency it adds."""
    from residency.cli.progress import BarProgress, progress_bar
    from residency.corpus.samples import get_sample
    from residency.eval.prune import PruneEvalJob, run_prune_eval

    check_fields(PruneEvalSettings, locals(), "k", "limit")
    bar = progress_bar(json)
    if squad is not None and (questions is not None or index is not None):
        raise ConfigError("--squad brings its own questions and index: drop --questions/--index")
    job = PruneEvalJob(
        squad_file=squad,
        pruner=bind(PrunerSettings, locals()),
        k=k,
        limit=limit,
        questions_file=questions,
        index_dir=index,
        sample=get_sample(sample),
        cache_dir=cache_dir,
    )
    with bar:
        report = run_prune_eval(job, BarProgress(bar))
    if json:
        echo_json(report)
    else:
        render_prune(report, Console())


def render_prune(report: PruneEvalReport, console: Console) -> None:
    """Settings line, the kept-sets table, latency and failures."""
    from rich import box
    from rich.table import Table

    s = report.settings
    console.print(
        f"[bold]{report.questions}[/] questions ({escape(s.source)}), top-{s.k} chunks from "
        f"{escape(s.index_dir)}; pruner {escape(s.model)} at {escape(s.url)}, keep grade >= "
        f"{s.threshold} plus the top {s.keep_top_k}",
        highlight=False,
    )
    table = Table(title="Pruning", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("kept set", no_wrap=True)
    for name in ("chunks\nkept", "chunks\nremoved", "chars\nremoved", "gold\nretrieved"):
        table.add_column(name, justify="right", no_wrap=True)
    table.add_column("gold\nkept", justify="right", no_wrap=True)
    for r in report.rows:
        table.add_row(
            r.name,
            f"{r.chunks_kept}/{r.chunks_retrieved}",
            pct(r.removed_share),
            pct(r.removed_chars_share),
            str(r.gold_retrieved),
            f"{r.gold_kept} ({pct(r.gold_kept_share)})",
        )
    console.print(table)
    lat = report.latency
    console.print(
        f"added latency per call: mean {lat.mean_s:.3f} s, p50 {lat.median_s:.3f} s, "
        f"p95 {lat.p95_s:.3f} s, max {lat.max_s:.3f} s",
        highlight=False,
    )
    failures = report.invalid_outputs + report.upstream_errors
    if failures:
        console.print(
            f"[yellow]warning:[/] {report.invalid_outputs} invalid output(s), "
            f"{report.upstream_errors} upstream error(s): those calls kept every chunk; first: "
            f"{escape(report.first_error or '')}",
            highlight=False,
        )
    else:
        console.print("every reply was schema-valid")
    for note in report.notes:
        console.print(f"note: {escape(note)}", highlight=False)
