"""`residency plan`: KV-cache capacity and the resident budget for a host."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import typer
from pydantic import BaseModel, ConfigDict, Field, model_validator

from residency.capacity.request import CapacityRequest
from residency.cli.qdrant_options import checked_qdrant, qdrant_backend
from residency.cli.spec import command
from residency.corpus.samples import SampleName
from residency.flags import Flag, IndexDir, JsonOutput, Output, Replicas, Section, TokenizerDir
from residency.planning.settings import PlanSettings
from residency.retrieval.qdrant_schema import QDRANT_SECTION, QdrantOptions

_PLAN = "Residency"
_QDRANT = "Qdrant (--retriever qdrant)"


class PlanArgs(BaseModel):
    """`residency plan`'s options: the host and vLLM flags (`CapacityRequest`), how to choose
    (`PlanSettings`), the corpus, the log and where the plan goes."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    request: CapacityRequest = Field(
        default_factory=CapacityRequest, description="The host and the vLLM flags."
    )
    settings: Annotated[PlanSettings, Section(panel=_PLAN, skip=frozenset({"seed"}))] = Field(
        default_factory=PlanSettings, description="How the resident sections are chosen."
    )
    index: Annotated[IndexDir, Flag(panel=_PLAN)] = None
    sample: Annotated[SampleName, Flag(panel=_PLAN)] = None
    log: Annotated[tuple[str, ...], Flag(panel=_PLAN)] = Field(
        default=(),
        description="Query log (jsonl: query, count, ts); repeatable, and globs (quoted: "
        "'logs/router-*.jsonl') merge several routers' logs by timestamp; none: density-only "
        "planning. Default with the sample corpus: its queries.jsonl.",
    )
    output: Annotated[Output, Flag(panel=_PLAN)] = None
    pin: Annotated[tuple[str, ...], Flag(panel=_PLAN)] = Field(
        default=(), description="Section id that is always resident (repeatable)."
    )
    exclude: Annotated[tuple[str, ...], Flag(panel=_PLAN)] = Field(
        default=(), description="Section id that is never resident (repeatable)."
    )
    tokenizer_dir: Annotated[TokenizerDir, Flag(panel=_PLAN)] = None
    capacity_only: Annotated[bool, Flag(panel=_PLAN)] = Field(
        default=False, description="Only the capacity and budget; no residency plan."
    )
    retriever: Annotated[Literal["hybrid", "qdrant"], Flag(panel=_PLAN)] = Field(
        default="hybrid",
        description="Log attribution: hybrid (the index's own BM25 + dense) or qdrant (the same "
        "fusion over the index's Qdrant collection, --qdrant).",
    )
    qdrant: Annotated[QdrantOptions | None, QDRANT_SECTION] = Field(
        default=None, description="The Qdrant collection (--retriever qdrant)."
    )
    replicas: Annotated[Replicas, Flag(panel=_PLAN)] = 1
    replica_server: Annotated[tuple[str, ...], Flag(panel=_PLAN)] = Field(
        default=(),
        description="A replica's vLLM server, read live (repeatable, in `serve --upstream` "
        "order): plan the fleet's placement over their own KV caches.",
    )
    json_output: JsonOutput = False

    @model_validator(mode="after")
    def _qdrant_with_its_retriever(self) -> PlanArgs:
        checked_qdrant(self.retriever, self.qdrant)
        return self


@command(PlanArgs)
def plan(args: PlanArgs) -> None:
    """Measure the host's KV-cache capacity, derive the resident budget, and choose the resident
    sections (plan.json)."""
    import orjson
    from rich.console import Console
    from rich.markup import escape

    from residency.atomic import check_output_file
    from residency.capacity.report import build_capacity_report
    from residency.cli.output import echo_json
    from residency.cli.plan_report import render, render_plan
    from residency.cli.progress import build_progress
    from residency.corpus.samples import get_sample
    from residency.planning.plan_model import write_plan
    from residency.planning.run import PlanJob, run_plan

    request, json, output = args.request, args.json_output, args.output or Path("plan.json")
    if not args.capacity_only:
        check_output_file(output)  # before minutes of planning, not after
    if args.capacity_only:
        report = build_capacity_report(request)
        if json:
            echo_json(report)
        else:
            render(report, Console())
        return
    job = PlanJob(
        capacity=request,
        index_dir=args.index,
        sample=None if args.sample is None else get_sample(args.sample),
        logs=args.log,
        backend=qdrant_backend(args.retriever, args.qdrant),
        tokenizer_dir=args.tokenizer_dir,
        settings=args.settings,
        pins=args.pin,
        excludes=args.exclude,
    )
    # --json or not, progress goes to stderr (a bar on a terminal, log lines elsewhere).
    with build_progress() as progress:
        if args.replicas > 1 or args.replica_server:
            from residency.planning.fleet_run import run_fleet_plan

            report, plan = run_fleet_plan(job, args.replicas, args.replica_server, progress)
        else:
            report, plan = run_plan(job, progress)
    err = Console(stderr=True)
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
    if plan.placement is not None:
        from residency.cli.plan_placement import render_placement

        render_placement(plan, console)
