"""`residency warm`: prefill the plan's prefix in vLLM, prove it is cached, keep it so (--watch)."""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Annotated

import orjson
import typer
from pydantic import BaseModel, ConfigDict, Field
from rich.console import Console
from rich.markup import escape

from residency.cli.spec import command
from residency.flags import Flag, JsonOutput, Section, Watch
from residency.warm.options import WATCH, WarmOptions, WatchSettings

if TYPE_CHECKING:
    from residency.planning.plan_model import ResidencyPlan
    from residency.warm import WarmReport, WatchEvent

EXIT_NOT_CACHED = 2


class WarmArgs(BaseModel):
    """`residency warm`'s options."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    plan: Path = Field(description="plan.json from `residency plan`.")
    options: WarmOptions = Field(
        default_factory=WarmOptions, description="The server and how hard to try."
    )
    watch: Annotated[Watch, Flag(panel=WATCH)] = False
    watch_settings: Annotated[WatchSettings, Section(panel=WATCH)] = Field(
        default_factory=WatchSettings, description="How --watch probes and waits."
    )
    replica: Annotated[int | None, Flag("--replica-index")] = Field(
        default=None,
        ge=0,
        le=1023,
        description="A plan with a placement (plan --replicas): warm the prefixes of the "
        "replica at this position (--server is that replica); default: every prefix.",
    )
    json_output: JsonOutput = False


@command(WarmArgs)
def warm(args: WarmArgs) -> None:
    """Prefill every resident prefix of the plan in vLLM and prove each is cached (exit 2 if
    not)."""
    from residency.planning.plan_model import read_plan
    from residency.warm import warm as run_warm

    options, json = args.options, args.json_output
    residency_plan = read_plan(args.plan)
    if args.replica is not None:
        from residency.planning.replicas import replica_plan

        held = replica_plan(residency_plan, args.replica)
        if held is None:
            typer.echo(f"replica {args.replica} holds no prefix in {args.plan}: nothing to warm")
            return
        residency_plan = held
    if args.watch:
        _watch(residency_plan, options, args.watch_settings, json)
        return
    from residency.cli.progress import build_progress

    with build_progress(json) as progress:
        report = run_warm(residency_plan, options, progress)
    if json:
        typer.echo(orjson.dumps(report.model_dump(mode="json"), option=orjson.OPT_INDENT_2))
    else:
        render(report, Console(soft_wrap=True))
    missed = [p for p in report.prefixes if not p.resident]
    if len(report.prefixes) > 1 and missed:
        Console(stderr=True, soft_wrap=True).print(
            "[bold red]error:[/] not cached after every prefix was warmed: "
            + ", ".join(
                f"{p.id} {p.cached_tokens:,} of {p.expected_cached_tokens:,}" for p in missed
            )
            + " expected tokens (raise --max-sightings, or lower plan --prefixes: the KV cache "
            "may not hold them all)",
            highlight=False,
        )
        raise typer.Exit(EXIT_NOT_CACHED)
    if not report.resident:
        Console(stderr=True, soft_wrap=True).print(
            f"[bold red]error:[/] prefix not cached after {report.sightings} sightings: "
            f"{report.cached_tokens:,} of {report.expected_cached_tokens:,} expected tokens "
            f"(raise --max-sightings, or check the server's KV cache size)",
            highlight=False,
        )
        raise typer.Exit(EXIT_NOT_CACHED)


def render(report: WarmReport, console: Console) -> None:
    """A readable summary: what is cached, vLLM's numbers, TTFT."""
    state = "[bold green]resident[/]" if report.resident else "[bold red]NOT cached[/]"
    first = report.sends[0]
    console.print(
        f"{state}: {report.shared_prefix_tokens:,}-token shared prefix "
        f"(plan prefix {report.prefix_tokens:,} tokens, {report.prefix_hash[:19]}…) on "
        f"{escape(report.served_model)} at {report.server}"
    )
    last = report.sends[-1]
    metric = (
        f"; vLLM prefix-cache hits +{last.metrics_hit_tokens:,} of "
        f"+{last.metrics_query_tokens:,} queried"
        if last.metrics_hit_tokens is not None and last.metrics_query_tokens is not None
        else ""
    )
    console.print(
        f"cached {report.cached_tokens:,} of {report.expected_cached_tokens:,} expected tokens "
        f"(block {report.block_size}){metric}"
    )
    if report.resident and len(report.sends) == 1:
        console.print(
            f"already resident: probe TTFT {report.warm_ttft_s:.3f} s, no cold prefill "
            f"[dim]({report.ttft_method})[/]",
            highlight=False,
        )
    else:
        ratio = report.warm_ttft_s / report.cold_ttft_s if report.cold_ttft_s else 0.0
        console.print(
            f"TTFT first prefill {report.cold_ttft_s:.3f} s ({first.hit_tokens():,} cached) -> "
            f"probe {report.warm_ttft_s:.3f} s ({ratio:.2f}x); {report.sightings} sighting(s) "
            f"before the hit [dim]({report.ttft_method})[/]",
            highlight=False,
        )
    if len(report.prefixes) > 1:
        for p in report.prefixes:
            mark = "[green]resident[/]" if p.resident else "[red]NOT cached[/]"
            console.print(
                f"  {p.id}: {mark}, probe after all warmed: {p.cached_tokens:,} of "
                f"{p.expected_cached_tokens:,} expected cached tokens ({p.shared_prefix_tokens:,}"
                f"-token shared prefix), TTFT {p.cold_ttft_s:.3f} s -> {p.probe_ttft_s:.3f} s",
                highlight=False,
            )
    for warning in report.warnings:
        console.print(f"[yellow]warning:[/] {escape(warning)}")


def _watch(plan: ResidencyPlan, options: WarmOptions, settings: WatchSettings, json: bool) -> None:
    """Run the loop with SIGINT/SIGTERM setting the stop event (a second signal aborts)."""
    from residency.warm.watch import watch

    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        watch(plan, options, settings, lambda e: _print_event(e, json), stop)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _print_event(event: WatchEvent, json: bool) -> None:
    """One line per event: JSON, or `TIME event=NAME message`."""
    if json:
        line = orjson.dumps(event.model_dump(mode="json", exclude_none=True)).decode()
    else:
        line = f"{event.at:%Y-%m-%dT%H:%M:%SZ} event={event.event} {event.message}"
    sys.stdout.write(line + "\n")
    sys.stdout.flush()
