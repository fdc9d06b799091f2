"""`residency eval answers`: answers of rag (top-k for each --rag-k), whole-text and residency,
scored by the reference scorer (and an LLM judge when given), side by side (registered on the
`residency eval` app)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field
from rich.console import Console
from rich.markup import escape

from residency.cli.output import compact_table, echo_json
from residency.cli.spec import command
from residency.corpus.samples import DEFAULT_SAMPLE, SampleName
from residency.eval.answers.options import AnswerEvalOptions
from residency.flags import IndexDir, JsonOutput, Questions

if TYPE_CHECKING:
    from residency.eval.answers.records import (
        AnswerEvalReport,
        ScoreSummary,
        StrategyReport,
    )

FAILURES_SHOWN = 20


class AnswersArgs(BaseModel):
    """`residency eval answers`'s options."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    questions: Questions = None
    sample: SampleName = None
    index: IndexDir = None  # rag's retrieval and whole's text
    options: AnswerEvalOptions = Field(
        default_factory=AnswerEvalOptions, description="Strategies, endpoints and sizes."
    )
    json_output: JsonOutput = False


@command(AnswersArgs)
def answers(args: AnswersArgs) -> None:
    """Generate answers per strategy, score them 0/1/2 against the reference (and an LLM judge),
    compare side by side, per question type."""
    from residency.cli.progress import BarProgress, progress_bar
    from residency.corpus.samples import get_sample
    from residency.eval.answers.records import load_answer_questions
    from residency.eval.answers.run import AnswerEvalJob, run_answer_eval
    from residency.index import open_index
    from residency.planning.run import sample_index

    options, index, json = args.options, args.index, args.json_output
    corpus = get_sample(args.sample or DEFAULT_SAMPLE)
    questions = args.questions if args.questions is not None else corpus.questions
    qs = load_answer_questions(questions)[: options.limit]
    bar = progress_bar(json)
    with bar:
        opened = sample_index(BarProgress(bar), corpus) if index is None else open_index(index)
        job = AnswerEvalJob(questions_path=questions, questions=qs, index=opened, options=options)
        report = run_answer_eval(job, BarProgress(bar))
    if json:
        echo_json(report)
    else:
        render_answers(report, Console(), options.records)


def _num(value: float | None, fmt: str) -> str:
    return "n/a" if value is None else format(value, fmt)


def _pct(part: int, whole: int) -> str:
    return "n/a" if whole == 0 else f"{100 * part / whole:.0f}%"


def _score_cells(s: ScoreSummary) -> list[str]:
    return [
        str(s.graded),
        _num(s.mean_score, ".2f"),
        _num(s.mean_f1, ".2f"),
        _pct(s.correct, s.graded),
        _pct(s.partial, s.graded),
        _pct(s.hallucinated, s.graded),
        _pct(s.abstained, s.graded),
        _num(s.truthfulness, "+.2f"),
        str(s.judge_errors),
        str(s.generation_errors),
    ]


_SCORE_COLUMNS = (
    "graded",
    "score\n/2",
    "F1",
    "cor-\nrect",
    "part-\nial",
    "wrong",
    "abst-\nained",
    "truth-\nful",
    "judge\nerror",
    "gen\nerror",
)
_COST_COLUMNS = (
    "evidence\nvisible",
    "score\nseen",
    "score\nunseen",
    "prompt\ntokens",
    "cached\ntokens",
    "TTFT\ns",
    "decode\ns",
)


def render_answers(report: AnswerEvalReport, console: Console, records: Path | None) -> None:
    """Settings, the side-by-side tables, scores per type, failures, notes."""
    s = report.settings
    judge = f"judge {escape(s.judge)} ({escape(str(s.judge_model))})" if s.judge else "no judge"
    console.print(
        f"[bold]{report.evaluated}[/] questions ({escape(s.questions)}); generator "
        f"{escape(str(s.generator))} ({escape(str(s.generator_model))}), {judge}"
        + (f", router {escape(s.router)}" if s.router else "")
        + f"; rag k={','.join(map(str, s.ks))}, max_tokens {s.max_tokens}, temperature 0",
        highlight=False,
    )
    for r in report.strategies:
        if r.skipped:
            console.print(f"[yellow]{r.strategy} skipped:[/] {escape(r.skipped)}", highlight=False)
    ran = [r for r in report.strategies if not r.skipped]
    _render_scores(ran, console)
    _render_cost(ran, console)
    _render_by_type(ran, console)
    _render_failures(report, console)
    for r in ran:
        if r.judge_overall is not None and r.judge_overall.judge_errors:
            console.print(
                f"{r.strategy}: {r.judge_overall.judge_errors} judge answer(s) could not be used "
                "(judge_error): excluded from the means, not scored 0",
                highlight=False,
            )
    for note in report.notes:
        console.print(f"note: {escape(note)}", highlight=False)
    if records is not None:
        console.print(f"records: {escape(str(records))}", highlight=False)


def _render_scores(ran: list[StrategyReport], console: Console) -> None:
    """The reference scorer's, the key facts' and the judge's scores, one row per strategy."""
    scores = compact_table(
        "Reference scorer (token F1 + abstention)", ("strategy",), _SCORE_COLUMNS[:-2]
    )
    scores.add_column("gen\nerror", justify="right", no_wrap=True)
    for r in ran:
        cells = _score_cells(r.overall)
        scores.add_row(r.strategy, *cells[:-2], cells[-1])
    console.print(scores)
    facts = compact_table(
        "Key facts (token F1 over tokens not in the question: echo scores 0)",
        ("strategy",),
        _SCORE_COLUMNS[:-2],
    )
    for r in ran:
        if r.facts_overall is not None:
            facts.add_row(r.strategy, *_score_cells(r.facts_overall)[:-2])
    console.print(facts)
    judged = [r for r in ran if r.judge_overall is not None]
    if judged:
        by_judge = compact_table(
            "LLM judge", ("strategy",), _SCORE_COLUMNS[:2] + _SCORE_COLUMNS[3:]
        )
        for r in judged:
            assert r.judge_overall is not None
            cells = _score_cells(r.judge_overall)
            by_judge.add_row(r.strategy, *cells[:2], *cells[3:])
        console.print(by_judge)


def _render_cost(ran: list[StrategyReport], console: Console) -> None:
    """Evidence, prompt, cache and latency means, and the routes taken, per strategy."""
    cost = compact_table(
        "Evidence, prompt, cache, latency (means over answers)", ("strategy",), _COST_COLUMNS
    )
    cost.add_column("routes")
    for r in ran:
        share = r.evidence_visible_share
        cost.add_row(
            r.strategy,
            "n/a" if share is None else f"{100 * share:.0f}%",
            _num(r.score_evidence_visible, ".2f"),
            _num(r.score_evidence_missing, ".2f"),
            _num(r.mean_prompt_tokens, ",.0f"),
            _num(r.mean_cached_tokens, ",.0f"),
            _num(r.mean_ttft_s, ".3f"),
            _num(r.mean_decode_s, ".3f"),
            ", ".join(f"{k} {v}" for k, v in sorted(r.route_counts.items())),
        )
    console.print(cost)


def _render_by_type(ran: list[StrategyReport], console: Console) -> None:
    """Types down, strategies across: reference score /2 and F1, key-fact score after '·' (the
    judge's score after '|')."""
    types = list(dict.fromkeys(t for r in ran for t in r.by_type))
    if not types:
        return
    table = compact_table(
        "By question type: score /2 (F1) · key facts /2",
        ("type", "n"),
        tuple(r.strategy for r in ran),
    )
    for t in types:
        n = max(r.by_type[t].questions for r in ran if t in r.by_type)
        cells: list[str] = []
        for r in ran:
            summary = r.by_type.get(t)
            if summary is None:
                cells.append("-")
                continue
            cell = _num(summary.mean_score, ".2f")
            if summary.mean_f1 is not None:
                cell += f" ({summary.mean_f1:.2f})"
            fact = (r.facts_by_type or {}).get(t)
            if fact is not None:
                cell += f" · {_num(fact.mean_score, '.2f')}"
            judged = (r.judge_by_type or {}).get(t)
            if judged is not None:
                cell += f" | {_num(judged.mean_score, '.2f')}"
            cells.append(cell)
        table.add_row(escape(t), str(n), *cells)
    console.print(table)


def _render_failures(report: AnswerEvalReport, console: Console) -> None:
    """Answers not scored correct, with gold and retrieved ids: retrieval or generation miss."""
    from residency.eval.answers.scoring import diagnose

    table = compact_table("Failures", ("strategy", "question", "type", "outcome", "why"), ())
    table.add_column("gold ids", max_width=36, overflow="fold")
    table.add_column("retrieved ids (route)", max_width=36, overflow="fold")
    table.add_column("answer", max_width=40, overflow="ellipsis", no_wrap=True)
    shown = 0
    total = sum(len(r.failures) for r in report.strategies)
    for r in report.strategies:
        for f in r.failures:
            if shown == FAILURES_SHOWN:
                break
            shown += 1
            why = diagnose(f).replace("_", " ")
            detail = f.generation_error or f.judge_error
            retrieved = ", ".join(f.retrieved_ids) or "-"
            table.add_row(
                r.strategy,
                escape(f.question_id),
                escape(f.type),
                f.outcome.replace("_", " "),
                escape(why + (f": {detail[:60]}" if detail else "")),
                escape(", ".join(f.relevant_ids) or "-"),
                escape(retrieved + (f" ({f.route})" if f.route else "")),
                escape(" ".join((f.answer or "").split())),
            )
    if total:
        console.print(table)
        if total > shown:
            console.print(f"... {total - shown} more failure(s): see --records or --json")
