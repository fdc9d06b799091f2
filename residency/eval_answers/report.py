"""Records and reports, pure: one question's attempt and verdict as an `AnswerRecord`, and a
strategy's records as a `StrategyReport` (scores overall and per type, cost, evidence, failures)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from residency.eval_answers.generate import Attempt
from residency.eval_answers.records import (
    AnswerQuestion,
    AnswerRecord,
    Grade,
    StrategyName,
    StrategyReport,
)
from residency.eval_answers.scoring import (
    error_verdict,
    evidence_share,
    judge_verdict,
    mean_of,
    score_group,
    summarize,
    summarize_by_type,
)

_ERROR_CHARS = 4000


def build_record(
    strategy: StrategyName,
    question: AnswerQuestion,
    attempt: Attempt,
    grade: Grade | None,
    judge_error: str | None,
) -> AnswerRecord:
    """The record of one question: answer, verdict, route, retrieval, usage and timings."""
    group = score_group(question.type)
    answer = attempt.answer
    if answer is None:
        verdict = error_verdict(generation_failed=True)
    elif grade is None:
        verdict = error_verdict(generation_failed=False)
    else:
        verdict = judge_verdict(group, grade)
    return AnswerRecord(
        strategy=strategy,
        question_id=question.id,
        type=group,
        query=question.query,
        reference=question.answer,
        relevant_ids=question.relevant_ids,
        answer=answer.text if answer else None,
        finish_reason=answer.finish_reason if answer else None,
        generation_error=(attempt.error or "no answer")[:_ERROR_CHARS] if answer is None else None,
        grade=grade if answer is not None else None,
        judge_error=judge_error[:_ERROR_CHARS] if judge_error and answer is not None else None,
        outcome=verdict.outcome,
        score=verdict.score,
        route=attempt.route,
        retrieved_ids=attempt.retrieved_ids,
        evidence_visible=attempt.evidence_visible,
        prompt_tokens=answer.prompt_tokens if answer else None,
        cached_tokens=answer.cached_tokens if answer else None,
        completion_tokens=answer.completion_tokens if answer else None,
        ttft_s=answer.ttft_s if answer else None,
        decode_s=answer.decode_s if answer else None,
        retrieval_s=attempt.retrieval_s,
    )


def strategy_report(
    strategy: StrategyName,
    records: Sequence[AnswerRecord],
    skipped: str | None = None,
    evidence_known: bool = True,
) -> StrategyReport:
    """Scores overall and per type, mean cost, evidence share, route counts and failures
    (`evidence_known` False: the share cannot be told, e.g. residency without its plan)."""
    answered = [r for r in records if r.generation_error is None]
    return StrategyReport(
        strategy=strategy,
        skipped=skipped,
        overall=summarize(records),
        by_type=summarize_by_type(records),
        mean_prompt_tokens=mean_of(r.prompt_tokens for r in answered),
        mean_cached_tokens=mean_of(r.cached_tokens for r in answered),
        mean_ttft_s=mean_of(r.ttft_s for r in answered),
        mean_decode_s=mean_of(r.decode_s for r in answered),
        evidence_visible_share=evidence_share(records) if evidence_known else None,
        route_counts=dict(Counter(r.route for r in answered if r.route is not None)),
        failures=tuple(r for r in records if r.outcome != "correct"),
    )
