"""Records and reports, pure: one question's attempt and verdicts as an `AnswerRecord`, and a
strategy's records as a `StrategyReport` (scores overall and per type, cost, evidence, failures)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from residency.eval.answers.generate import Attempt
from residency.eval.answers.options import StrategyName
from residency.eval.answers.records import AnswerQuestion, AnswerRecord, Grade, StrategyReport
from residency.eval.answers.reference import score_reference
from residency.eval.answers.scoring import (
    Verdict,
    error_verdict,
    evidence_share,
    judge_verdict,
    mean_of,
    score_by_evidence,
    score_group,
    summarize,
    summarize_by_type,
)

_ERROR_CHARS = 4000


def build_record(
    strategy: str,
    kind: StrategyName,
    question: AnswerQuestion,
    attempt: Attempt,
    grade: Grade | None,
    judge_error: str | None,
    judged: bool,
) -> AnswerRecord:
    """The record of one question: answer, both verdicts, route, retrieval, usage and timings
    (`judged` False: no judge was asked, so the judge's fields stay None)."""
    group = score_group(question.type)
    answer = attempt.answer
    reference = (
        score_reference(group, answer.text, question.answer, question.query) if answer else None
    )
    judge: Verdict | None = None
    if answer is None:
        judge = error_verdict(generation_failed=True) if judged else None
    elif grade is not None:
        judge = judge_verdict(group, grade)
    elif judged:
        judge = error_verdict(generation_failed=False)
    return AnswerRecord(
        strategy=strategy,
        kind=kind,
        question_id=question.id,
        type=group,
        query=question.query,
        reference=question.answer,
        relevant_ids=question.relevant_ids,
        answer=answer.text if answer else None,
        finish_reason=answer.finish_reason if answer else None,
        generation_error=(attempt.error or "no answer")[:_ERROR_CHARS] if answer is None else None,
        f1=reference.f1 if reference else None,
        recall=reference.recall if reference else None,
        abstained=reference.abstained if reference else None,
        outcome=reference.outcome if reference else "generation_error",
        score=reference.score if reference else None,
        fact_f1=reference.fact_f1 if reference else None,
        fact_outcome=reference.fact_outcome if reference else None,
        fact_score=reference.fact_score if reference else None,
        grade=grade if answer is not None else None,
        judge_error=judge_error[:_ERROR_CHARS] if judge_error and answer is not None else None,
        judge_outcome=judge.outcome if judge else None,
        judge_score=judge.score if judge else None,
        route=attempt.route,
        retrieved_ids=attempt.retrieved_ids,
        citations=attempt.citations,
        evidence_visible=attempt.evidence_visible,
        prompt_tokens=answer.prompt_tokens if answer else None,
        cached_tokens=answer.cached_tokens if answer else None,
        completion_tokens=answer.completion_tokens if answer else None,
        ttft_s=answer.ttft_s if answer else None,
        decode_s=answer.decode_s if answer else None,
        retrieval_s=attempt.retrieval_s,
    )


def _failed(record: AnswerRecord, judged: bool) -> bool:
    """Not correct by the reference scorer, or (with a judge) not correct by the judge."""
    return record.outcome != "correct" or (judged and record.judge_outcome != "correct")


def strategy_report(
    strategy: str,
    kind: StrategyName,
    records: Sequence[AnswerRecord],
    *,
    k: int | None = None,
    judged: bool = False,
    skipped: str | None = None,
    evidence_known: bool = True,
) -> StrategyReport:
    """Scores overall and per type (reference scorer, and the judge's when `judged`), mean
    cost, evidence share and the score with and without evidence, route counts and failures
    (`evidence_known` False: the share cannot be told, e.g. residency without its plan)."""
    answered = [r for r in records if r.generation_error is None]
    return StrategyReport(
        strategy=strategy,
        kind=kind,
        k=k,
        skipped=skipped,
        overall=summarize(records),
        by_type=summarize_by_type(records),
        facts_overall=summarize(records, "facts"),
        facts_by_type=summarize_by_type(records, "facts"),
        judge_overall=summarize(records, "judge") if judged else None,
        judge_by_type=summarize_by_type(records, "judge") if judged else None,
        score_evidence_visible=score_by_evidence(records, True) if evidence_known else None,
        score_evidence_missing=score_by_evidence(records, False) if evidence_known else None,
        mean_prompt_tokens=mean_of(r.prompt_tokens for r in answered),
        mean_cached_tokens=mean_of(r.cached_tokens for r in answered),
        mean_ttft_s=mean_of(r.ttft_s for r in answered),
        mean_decode_s=mean_of(r.decode_s for r in answered),
        evidence_visible_share=evidence_share(records) if evidence_known else None,
        route_counts=dict(Counter(r.route for r in answered if r.route is not None)),
        failures=tuple(r for r in records if _failed(r, judged)),
    )
