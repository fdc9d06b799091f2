"""`residency eval coverage`: one plan over a questions file, or the simulated comparison of
every strategy on a SQuAD-style file (registered on the `residency eval` app)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.markup import escape

from residency.cli.options import JsonOption
from residency.cli.output import compact_table, echo_json, pct
from residency.errors import ConfigError
from residency.eval.defaults import (
    COVERAGE_CACHE,
    DEFAULT_EVAL_SIZE,
    DEFAULT_LOG_SIZE,
    DEFAULT_PREFETCH,
    DEFAULT_ZIPF_S,
)
from residency.routing import DEFAULT_HEDGE, DEFAULT_K, DEFAULT_MARGIN

if TYPE_CHECKING:
    from rich.table import Table

    from residency.eval.coverage_report import CoverageMetrics, CoverageReport


def coverage(
    plan: Annotated[
        Path | None, typer.Option(help="Evaluate this plan.json (with --questions).")
    ] = None,
    questions: Annotated[
        Path | None,
        typer.Option(help="jsonl: query, relevant_ids (gold section ids), optional type and id."),
    ] = None,
    squad: Annotated[
        Path | None,
        typer.Option(
            help="Simulate traffic over this SQuAD-style file and compare every strategy."
        ),
    ] = None,
    budget: Annotated[
        int, typer.Option(help="Resident budget in tokens for every strategy (--squad).")
    ] = 30000,
    kv_cache_tokens: Annotated[
        int | None,
        typer.Option(
            help="--squad: model a host with this many KV-cache tokens (with --max-model-len): "
            "adds the rows single-prefix and residency (several prefixes, as served).",
            show_default=False,
        ),
    ] = None,
    max_model_len: Annotated[
        int | None,
        typer.Option(help="--squad: the modelled host's max_model_len.", show_default=False),
    ] = None,
    concurrency: Annotated[
        int, typer.Option(help="--squad: requests the modelled host serves at once.")
    ] = 1,
    zipf: Annotated[
        float, typer.Option(help="Zipf exponent s of paragraph popularity (--squad).")
    ] = DEFAULT_ZIPF_S,
    log_size: Annotated[
        int, typer.Option(help="Simulated log questions the planner sees (--squad).")
    ] = DEFAULT_LOG_SIZE,
    eval_size: Annotated[
        int, typer.Option(help="Simulated evaluation questions, disjoint from the log (--squad).")
    ] = DEFAULT_EVAL_SIZE,
    seed: Annotated[int, typer.Option(help="Seed of the simulation and of random residency.")] = 0,
    seeds: Annotated[
        int,
        typer.Option(
            help="--squad: run this many traffic seeds (--seed, --seed + 1, ...) and report "
            "each row's mean and sd."
        ),
    ] = 1,
    index_dir: Annotated[
        Path | None,
        typer.Option(
            help="Index to use: --plan: instead of the plan's own; --squad: build or reuse it "
            "here (default: under --cache-dir)."
        ),
    ] = None,
    dense: Annotated[
        bool,
        typer.Option(
            "--dense", help="--squad: hybrid index (dense + BM25); embedding takes minutes."
        ),
    ] = False,
    cache_dir: Annotated[
        Path,
        typer.Option(
            help="--squad: where the imported corpus and its index are kept.",
            show_default="CACHE/coverage",
        ),
    ] = COVERAGE_CACHE,
    tokenizer_dir: Annotated[
        Path | None,
        typer.Option(help="--plan: tokenizer for added tokens (default: the plan's)."),
    ] = None,
    k: Annotated[int, typer.Option("--k", help="Long-tail chunks added per question.")] = DEFAULT_K,
    margin: Annotated[
        int, typer.Option(help="Routing margin: long-tail ranks tolerated behind a resident top.")
    ] = DEFAULT_MARGIN,
    hedge: Annotated[
        int, typer.Option(help="Non-resident chunks the resident route still adds (insurance).")
    ] = DEFAULT_HEDGE,
    prefetch: Annotated[
        int, typer.Option(help="Chunks ranked per question before routing.")
    ] = DEFAULT_PREFETCH,
    json: JsonOption = False,
) -> None:
    """Share of questions whose gold evidence is resident or routed in, and the tokens it costs."""
    from residency.cli.progress import BarProgress, progress_bar
    from residency.eval.coverage_runs import SimulationJob, evaluate_plan_file, run_simulations
    from residency.eval.traffic import TrafficOptions, check_traffic_options

    if (plan is None) == (squad is None):
        raise ConfigError(
            "pass either --plan PLAN.json --questions QA.jsonl (evaluate one plan) or "
            "--squad FILE (simulate traffic and compare every strategy)"
        )
    bar = progress_bar(json)
    if plan is not None:
        if questions is None:
            raise ConfigError(f"--plan {plan} needs --questions QA.jsonl to evaluate on")
        with bar:
            report = evaluate_plan_file(
                plan,
                questions,
                index_dir=index_dir,
                tokenizer_dir=tokenizer_dir,
                k=k,
                margin=margin,
                hedge=hedge,
                prefetch=prefetch,
                progress=BarProgress(bar),
            )
    else:
        assert squad is not None
        check_traffic_options(zipf, log_size, eval_size, seed)
        job = SimulationJob(
            squad_file=squad,
            budget_tokens=budget,
            traffic=TrafficOptions(zipf_s=zipf, log_size=log_size, eval_size=eval_size, seed=seed),
            index_dir=index_dir,
            dense=dense,
            cache_dir=cache_dir,
            k=k,
            margin=margin,
            hedge=hedge,
            prefetch=prefetch,
            kv_cache_tokens=kv_cache_tokens,
            max_model_len=max_model_len,
            concurrency=concurrency,
        )
        with bar:
            report = run_simulations(job, seeds, BarProgress(bar))
    if json:
        echo_json(report)
    else:
        render_coverage(report, Console())


def _coverage_row(m: CoverageMetrics) -> list[str]:
    return [
        f"{100 * m.coverage:.2f}%",
        f"{100 * m.coverage_all:.2f}%",
        pct(m.resident_share),
        pct(m.long_tail_recall),
        str(m.misrouted),
        pct(m.route_resident_share),
        f"{m.mean_added_tokens:.0f}",
    ]


_COVERAGE_COLUMNS = (
    "coverage",
    "coverage\nall",
    "in\nprefix",
    "long-tail\nrecall",
    "mis-\nrouted",
    "resident\nroute",
    "added\ntokens",
)


def _table(title: str, lead: tuple[str, ...], tail: tuple[str, ...] = ()) -> Table:
    return compact_table(title, lead, (*_COVERAGE_COLUMNS, *tail))


def render_coverage(report: CoverageReport, console: Console) -> None:
    """Settings, simulation, the comparison table and the per-type table."""
    s = report.settings
    retrieval = f"hybrid ({s.embedder} + BM25)" if s.embedder else "BM25-only"
    ks = "/".join(str(k) for k in sorted({r.k for r in report.results}))
    console.print(
        f"[bold]{report.evaluated}[/] questions ({escape(report.questions_source)}); index "
        f"{escape(s.index_dir)}: {retrieval}, chunks {s.chunker}; prefetch {s.prefetch}, "
        f"margin {s.margin}, hedge {s.hedge}, long-tail route adds k={ks} chunks; added tokens "
        f"counted with "
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
    table = _table("Coverage", ("strategy",), ("resident\nsections", "rag-top5\nmisses\nrescued"))
    for r in report.results:
        rescued = pct(r.rag_misses_rescued)
        table.add_row(r.name, *_coverage_row(r.overall), str(r.resident_sections), rescued)
    console.print(table)
    if report.across_seeds:
        n = report.across_seeds[0].seeds
        seeds = compact_table(
            f"Across {n} traffic seeds (mean ± sd)",
            ("strategy",),
            (
                "coverage",
                "coverage\nall",
                "in\nprefix",
                "added\ntokens",
                "rag-top5\nmisses\nrescued",
            ),
        )
        for row in report.across_seeds:
            seeds.add_row(
                row.name,
                f"{100 * row.coverage.mean:.2f} ± {100 * row.coverage.sd:.2f}%",
                f"{100 * row.coverage_all.mean:.2f} ± {100 * row.coverage_all.sd:.2f}%",
                f"{100 * row.resident_share.mean:.1f} ± {100 * row.resident_share.sd:.1f}%",
                f"{row.mean_added_tokens.mean:.0f} ± {row.mean_added_tokens.sd:.0f}",
                (
                    f"{100 * rs.mean:.0f} ± {100 * rs.sd:.0f}%"
                    if (rs := row.rag_misses_rescued) is not None
                    else "-"
                ),
            )
        console.print(seeds)
    types = sorted({t for r in report.results for t in r.by_type})
    if len(types) > 1:
        by_type = _table("By question type", ("type", "strategy", "n"))
        for qt in types:
            for r in report.results:
                if qt in r.by_type:
                    m = r.by_type[qt]
                    by_type.add_row(escape(qt), r.name, str(m.questions), *_coverage_row(m))
        console.print(by_type)
    if report.excluded_no_relevant:
        console.print(f"{report.excluded_no_relevant} question(s) without relevant ids excluded")
    if report.unknown_relevant_count:
        console.print(
            f"[yellow]warning:[/] {report.unknown_relevant_count} relevant id(s) are not sections "
            "of this index and always count as misses"
        )
    for note in report.notes:
        console.print(f"note: {escape(note)}", highlight=False)
