"""Pure scoring: a graded answer's outcome and points, and the means of a group of records.

Every record carries two verdicts on the same 0/1/2 scale: the reference scorer's (always;
`reference.py`) and the LLM judge's (when a judge was given). `summarize` reads either.

Rules for the judge's grade (docs/design/evaluation.md, CRAG's truthfulness):
- score 2 correct, 1 partial, 0 wrong, from the judge; `abstained` is the judge's separate flag.
- `unknown` questions (not answerable from the text): an abstention is the right answer and
  counts as correct (2 points); a concrete answer keeps the judge's score.
- Other types: an answer worth points keeps them; a 0-point abstention counts as `abstained`
  (0 points, "missing" in CRAG), apart from a 0-point answer that was given (`hallucinated`).
- truthfulness = (correct - hallucinated) / graded, in [-1, 1].
- A judge answer that could not be used, or a question the generator failed, is excluded from
  every mean and counted on its own: never scored 0.

Worked example: four graded records, scores 2, 1, 0 (answered), 0 (abstained) → mean 0.75,
truthfulness (1 - 1) / 4 = 0.0; a fifth record with a judge error leaves both unchanged.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from residency.eval.answers.records import (
    OTHER_TYPE,
    QUESTION_TYPES,
    UNKNOWN_TYPE,
    AnswerRecord,
    Diagnosis,
    Grade,
    Outcome,
    Scorer,
    ScoreSummary,
)


def score_group(question_type: str) -> str:
    """The group a question's type is scored in: one of the six types, else 'other'."""
    normalized = question_type.strip().lower()
    return normalized if normalized in QUESTION_TYPES else OTHER_TYPE


@dataclass(frozen=True, slots=True)
class Verdict:
    """What a graded (or failed) answer counts as, and the points it adds to the mean."""

    outcome: Outcome
    score: int | None


def judge_verdict(group: str, grade: Grade) -> Verdict:
    """The outcome and points of a parsed grade for a question scored in `group`."""
    if group == UNKNOWN_TYPE and grade.abstained:
        return Verdict("correct", 2)
    if grade.score == 2:
        return Verdict("correct", 2)
    if grade.score == 1:
        return Verdict("partial", 1)
    if grade.abstained and group != UNKNOWN_TYPE:
        return Verdict("abstained", 0)
    return Verdict("hallucinated", 0)


def error_verdict(generation_failed: bool) -> Verdict:
    """An answer that was not generated, or not graded: excluded from the means."""
    return Verdict("generation_error" if generation_failed else "judge_error", None)


def verdict_of(record: AnswerRecord, scorer: Scorer) -> tuple[Outcome | None, int | None]:
    """(outcome, points) of a record by the reference scorer or by the judge."""
    if scorer == "reference":
        return record.outcome, record.score
    if scorer == "facts":
        if record.fact_outcome is None:  # no answer, or a record written before key facts
            return record.outcome, None
        return record.fact_outcome, record.fact_score
    return record.judge_outcome, record.judge_score


def summarize(records: Iterable[AnswerRecord], scorer: Scorer = "reference") -> ScoreSummary:
    """Counts, mean score and truthfulness of a group of records, by one scorer."""
    rows = list(records)
    verdicts = [verdict_of(r, scorer) for r in rows]
    counts = {o: sum(1 for v in verdicts if v[0] == o) for o in _OUTCOMES}
    points = [p for _, p in verdicts if p is not None]
    graded = len(points)
    f1 = None
    if scorer == "reference":
        f1 = mean_of(r.f1 for r in rows if r.type != UNKNOWN_TYPE)
    elif scorer == "facts":
        f1 = mean_of(r.fact_f1 for r in rows if r.type != UNKNOWN_TYPE)
    return ScoreSummary(
        questions=len(rows),
        graded=graded,
        judge_errors=counts["judge_error"],
        generation_errors=counts["generation_error"],
        mean_score=sum(points) / graded if graded else None,
        correct=counts["correct"],
        partial=counts["partial"],
        hallucinated=counts["hallucinated"],
        abstained=counts["abstained"],
        truthfulness=(counts["correct"] - counts["hallucinated"]) / graded if graded else None,
        mean_f1=f1,
    )


_OUTCOMES: tuple[Outcome, ...] = (
    "correct",
    "partial",
    "hallucinated",
    "abstained",
    "judge_error",
    "generation_error",
)


def summarize_by_type(
    records: Iterable[AnswerRecord], scorer: Scorer = "reference"
) -> dict[str, ScoreSummary]:
    """One summary per scoring group present, in the canonical type order, 'other' last."""
    groups: dict[str, list[AnswerRecord]] = {}
    for r in records:
        groups.setdefault(r.type, []).append(r)
    order = [*QUESTION_TYPES, OTHER_TYPE]
    return {t: summarize(groups[t], scorer) for t in sorted(groups, key=order.index)}


def score_by_evidence(records: Iterable[AnswerRecord], visible: bool) -> float | None:
    """Mean reference points of answered, answerable records whose gold was (not) visible:
    does answer quality follow evidence coverage?"""
    return mean_of(
        r.score for r in records if r.evidence_visible is visible and r.score is not None
    )


def evidence_visible(relevant_ids: Sequence[str], visible_ids: Iterable[str]) -> bool | None:
    """Whether any gold section is among the visible ones; None for a question without gold."""
    if not relevant_ids:
        return None
    visible = set(visible_ids)
    return any(s in visible for s in relevant_ids)


def diagnose(record: AnswerRecord) -> Diagnosis:
    """Why an answer that was not correct failed: the evidence missing, or the model."""
    if record.outcome in ("judge_error", "generation_error"):
        return "error"
    if not record.relevant_ids:
        return "unanswerable"
    if record.evidence_visible is False:
        return "retrieval_miss"
    return "generation_miss"


def evidence_share(records: Iterable[AnswerRecord]) -> float | None:
    """Share of answered records with gold ids whose evidence was visible (None: none count)."""
    flags = [
        r.evidence_visible
        for r in records
        if r.evidence_visible is not None and r.generation_error is None
    ]
    return sum(flags) / len(flags) if flags else None


def mean_of(values: Iterable[float | int | None]) -> float | None:
    """Mean of the values that are not None (None when there are none)."""
    present = [float(v) for v in values if v is not None]
    return sum(present) / len(present) if present else None
