"""`residency eval`: evaluation commands: retrieval (history file and budgets) and coverage."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from pydantic import BaseModel, ConfigDict, Field, model_validator
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from residency.cli.output import echo_json
from residency.cli.qdrant_options import checked_qdrant, qdrant_backend
from residency.cli.spec import command
from residency.errors import ConfigError
from residency.eval.defaults import HISTORY_FILE, METRICS
from residency.eval.retrieval_options import RetrievalEvalOptions
from residency.flags import IndexDir, JsonOutput, Questions
from residency.retrieval.qdrant_schema import QDRANT_SECTION, QdrantOptions

if TYPE_CHECKING:
    from residency.eval.retrieval import RetrievalEvalReport

app = typer.Typer(
    name="eval",
    help="Evaluate retrieval (recall, history, budgets), coverage (resident prefix + routing), "
    "answers (LLM judge) and the pruner.",
    no_args_is_help=True,
)

BUDGET_EXIT_CODE = 2


def _fusion_weights(given: dict[str, float] | None) -> dict[str, float] | None:
    """The given weights over the default fusion weights (None: the defaults)."""
    if not given:
        return None
    from residency.retrieval import DEFAULT_WEIGHTS  # faiss, bm25s: only when a weight is given

    unknown = sorted(given.keys() - DEFAULT_WEIGHTS.keys())
    if unknown:
        raise ConfigError(
            f"--weight {unknown[0]}: not a fused retriever; expected one of "
            f"{', '.join(DEFAULT_WEIGHTS)}, e.g. dense=0.3"
        )
    return {**DEFAULT_WEIGHTS, **given}


class RetrievalArgs(BaseModel):
    """`residency eval retrieval`'s options."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    index: IndexDir = None
    questions: Questions = None
    options: RetrievalEvalOptions = Field(
        default_factory=RetrievalEvalOptions, description="Retrievers, fusion and history."
    )
    min_recall: tuple[str, ...] = Field(
        default=(),
        description=f"Budget for the fusion, e.g. R@10=0.80 (repeatable; {', '.join(METRICS)}); "
        f"exit {BUDGET_EXIT_CODE} when one is missed.",
    )
    qdrant: Annotated[QdrantOptions | None, QDRANT_SECTION] = Field(
        default=None, description="The Qdrant collection (--retriever qdrant)."
    )
    json_output: JsonOutput = False

    @model_validator(mode="after")
    def _qdrant_with_its_retriever(self) -> RetrievalArgs:
        if self.index is None or self.questions is None:
            raise ValueError(
                "eval retrieval scores an index against questions: give --index and --questions"
            )
        checked_qdrant(self.options.retriever, self.qdrant)
        return self


@app.command("retrieval")
@command(RetrievalArgs)
def retrieval(args: RetrievalArgs) -> None:
    """Recall@1/3/5/10, MRR@10 and nDCG@10 of BM25, dense and the fusion, per question type."""
    from residency.cli.progress import progress_bar
    from residency.eval.questions import load_questions
    from residency.eval.retrieval import append_history, evaluate_retrieval, parse_budget
    from residency.index import open_index

    options, index, questions, json = args.options, args.index, args.questions, args.json_output
    assert index is not None  # RetrievalArgs refuses a run without --index or --questions
    assert questions is not None
    budgets = [parse_budget(b) for b in args.min_recall]
    backend = qdrant_backend(options.retriever, args.qdrant)
    opened = open_index(index, weights=_fusion_weights(options.weights), backend=backend)
    qs = load_questions(questions)
    bar = progress_bar(json, transient=False)
    err = bar.console
    with bar:
        task = bar.add_task("questions", total=sum(1 for q in qs if q.relevant_ids))
        report = evaluate_retrieval(
            opened, questions, qs, budgets, progress=lambda n: bar.advance(task, n)
        )
    history_path = options.history if options.history is not None else index / HISTORY_FILE
    append_history(history_path, report)
    if json:
        echo_json(report)
    else:
        render(report, history_path, Console())
    failed = [b for b in report.budgets if not b.passed]
    for b in failed:
        actual = "n/a" if b.actual is None else f"{b.actual:.4f}"
        err.print(
            f"[bold red]budget missed:[/] hybrid {b.metric} = {actual} < {b.minimum:.2f} "
            f"(--min-recall {b.metric}={b.minimum:g})",
            highlight=False,
        )
    if failed:
        raise typer.Exit(BUDGET_EXIT_CODE)


def _metrics_table(title: str, report: RetrievalEvalReport, by_type: bool) -> Table:
    table = Table(title=title, title_justify="left")
    if by_type:
        table.add_column("type")
    table.add_column("retriever")
    table.add_column("n", justify="right")
    for name in METRICS:
        table.add_column(name, justify="right")
    types = sorted({t for r in report.retrievers.values() for t in r.by_type}) if by_type else [""]
    for t in types:
        for name, rep in report.retrievers.items():
            m = rep.by_type.get(t) if by_type else rep.overall
            if m is None:
                continue
            cells = [f"{m.value(metric):.3f}" for metric in METRICS]
            table.add_row(*([escape(t)] if by_type else []), name, str(m.questions), *cells)
    return table


def render(report: RetrievalEvalReport, history: Path, console: Console) -> None:
    """Overall and per-type tables, exclusions, unknown ids, budgets, history path."""
    s = report.settings
    weights = ", ".join(f"{k} {v:g}" for k, v in s.weights.items())
    console.print(
        f"[bold]{report.evaluated}[/] questions evaluated on {escape(report.index_dir)} "
        f"through {escape(s.backend)} "
        f"(embedder {s.embedder or 'none'}, BM25 {s.sparse_tokenizer}, chunks {s.chunker}; "
        f"RRF k={s.rrf_k}, prefetch {s.prefetch}, weights {weights}); section-level ranks",
        highlight=False,
    )
    console.print(_metrics_table("Overall", report, by_type=False))
    if len({t for r in report.retrievers.values() for t in r.by_type}) > 1:
        console.print(_metrics_table("By question type", report, by_type=True))
    if report.excluded_no_relevant:
        console.print(
            f"{report.excluded_no_relevant} question(s) without relevant ids (type unknown) "
            "excluded from retrieval metrics"
        )
    if report.unknown_relevant_count:
        shown = ", ".join(report.unknown_relevant_ids[:5])
        console.print(
            f"[yellow]warning:[/] {report.unknown_relevant_count} relevant id(s) are not sections "
            f"of this index and always count as misses (e.g. {escape(shown)}); were the "
            "questions written for this corpus root?"
        )
    for b in report.budgets:
        state = "[green]ok[/]" if b.passed else "[red]MISSED[/]"
        actual = "n/a" if b.actual is None else f"{b.actual:.4f}"
        console.print(f"budget hybrid {b.metric} >= {b.minimum:g}: {actual} {state}")
    console.print(f"history: appended to {escape(str(history))}")


def _register_subcommands() -> None:
    from residency.cli.eval_answers import answers
    from residency.cli.eval_coverage import coverage
    from residency.cli.eval_prune import prune

    app.command("coverage")(coverage)
    app.command("answers")(answers)
    app.command("prune")(prune)


_register_subcommands()
