"""`residency eval prune`: context the listwise pruner removes on a SQuAD-style file or a
question set with gold section ids, and the gold evidence it keeps (registered on the
`residency eval` app)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator
from rich.console import Console
from rich.markup import escape

from residency.cli.output import echo_json, pct
from residency.cli.spec import command
from residency.context.pruner_settings import PRUNER_FLAGS, PRUNER_SKIP, PrunerSettings
from residency.corpus.samples import DEFAULT_SAMPLE, SampleName
from residency.eval.defaults import COVERAGE_CACHE, CoverageCacheDir
from residency.eval.prune_report import PruneEvalReport, PruneSample
from residency.flags import IndexDir, JsonOutput, Questions, Section, SquadFile


class PruneArgs(BaseModel):
    """`residency eval prune`'s options."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    pruner: Annotated[PrunerSettings | None, Section(flags=PRUNER_FLAGS, skip=PRUNER_SKIP)] = Field(
        default=None, description="The grading model and how grades become a kept set."
    )
    squad: SquadFile = None  # without it: --questions over --index
    questions: Questions = None
    index: IndexDir = None  # where the --questions' chunks come from
    sample: SampleName = None
    sampling: PruneSample = Field(
        default_factory=PruneSample, description="Questions and chunks graded."
    )
    cache_dir: CoverageCacheDir = COVERAGE_CACHE
    json_output: JsonOutput = False

    @model_validator(mode="after")
    def _one_source(self) -> PruneArgs:
        if self.pruner is None:
            raise ValueError(
                "eval prune grades with a model: give --pruner-url (and --pruner-model)"
            )
        if self.squad is not None and (self.questions is not None or self.index is not None):
            raise ValueError("--squad brings its own questions and index: drop --questions/--index")
        return self


@command(PruneArgs)
def prune(args: PruneArgs) -> None:
    """Share of retrieved chunks the pruner removes, gold evidence kept, and the latency it adds."""
    from residency.cli.progress import BarProgress, progress_bar
    from residency.corpus.samples import get_sample
    from residency.eval.prune import PruneEvalJob, run_prune_eval

    json = args.json_output
    assert args.pruner is not None  # PruneArgs refuses a run without one
    bar = progress_bar(json)
    job = PruneEvalJob(
        squad_file=args.squad,
        pruner=args.pruner,
        k=args.sampling.k,
        limit=args.sampling.limit,
        questions_file=args.questions,
        index_dir=args.index,
        sample=get_sample(args.sample or DEFAULT_SAMPLE),
        cache_dir=args.cache_dir,
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
