"""Answer-eval scoring on hand-made records: verdicts, means per type, abstention, errors.

Every expected value is computed by hand in the test's comment; records go through the same
`build_record` the run uses, so outcome and points come from the real rules.
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from residency.errors import ConfigError, CorpusError
from residency.eval_answers import (
    AnswerEvalJob,
    AnswerQuestion,
    AnswerRecord,
    Grade,
    JudgeError,
    judge_verdict,
    load_answer_questions,
    parse_grade,
    score_group,
    summarize,
    summarize_by_type,
)
from residency.eval_answers.chat import StreamedAnswer
from residency.eval_answers.generate import Attempt, parse_retrieved_header
from residency.eval_answers.report import build_record, strategy_report
from residency.eval_answers.run import check_job
from residency.eval_answers.scoring import diagnose, evidence_share, evidence_visible


@pytest.mark.parametrize(
    ("group", "score", "abstained", "outcome", "points"),
    [
        pytest.param("simple", 2, False, "correct", 2, id="simple-2"),
        pytest.param("simple", 1, False, "partial", 1, id="simple-1"),
        pytest.param("simple", 0, False, "hallucinated", 0, id="simple-0-answered"),
        pytest.param("simple", 0, True, "abstained", 0, id="simple-0-abstained: apart from wrong"),
        pytest.param("detail", 1, True, "partial", 1, id="abstained-but-partly-right keeps 1"),
        pytest.param("unknown", 0, True, "correct", 2, id="unknown-abstained: correct"),
        pytest.param("unknown", 0, False, "hallucinated", 0, id="unknown-invented: wrong"),
        pytest.param("unknown", 2, False, "correct", 2, id="unknown-judge-says-2"),
        pytest.param("other", 0, True, "abstained", 0, id="other-abstained"),
    ],
)
def test_judge_verdict(group: str, score: int, abstained: bool, outcome: str, points: int) -> None:
    verdict = judge_verdict(group, Grade.model_validate({"score": score, "abstained": abstained}))
    assert (verdict.outcome, verdict.score) == (outcome, points)


@pytest.mark.parametrize(
    ("raw", "group"),
    [
        pytest.param("simple", "simple", id="known"),
        pytest.param(" Timeline ", "timeline", id="case-and-space"),
        pytest.param("trivia", "other", id="unknown-type->other"),
        pytest.param("unknowable", "other", id="prefix-is-not-enough"),
    ],
)
def test_score_group(raw: str, group: str) -> None:
    assert score_group(raw) == group


def _answer(text: str = "an answer", prompt: int = 100, cached: int | None = 0) -> StreamedAnswer:
    return StreamedAnswer(text, "stop", 0.5, 0.25, prompt, cached, 10, {})


def _record(
    qtype: str,
    grade: tuple[int, bool] | None,
    *,
    judge_error: str | None = None,
    generated: bool = True,
    gold: tuple[str, ...] = ("s1",),
    retrieved: tuple[str, ...] = ("s1",),
    prompt: int = 100,
    qid: str = "q",
) -> AnswerRecord:
    question = AnswerQuestion(id=qid, query="Q?", relevant_ids=gold, type=qtype, answer="reference")
    answer = _answer(prompt=prompt) if generated else None
    attempt = Attempt(
        answer,
        None if generated else "HTTP 400: too long",
        "rag",
        retrieved,
        evidence_visible(gold, retrieved),
        0.01,
    )
    parsed = None if grade is None else Grade(score=grade[0], abstained=grade[1])  # type: ignore[arg-type]
    return build_record("rag", question, attempt, parsed, judge_error)


def _hand_made() -> list[AnswerRecord]:
    return [
        _record("simple", (2, False), qid="s-correct-1"),
        _record("simple", (2, False), qid="s-correct-2"),
        _record("simple", (1, False), qid="s-partial"),
        _record("simple", (0, False), qid="s-wrong", retrieved=("s9",)),
        _record("simple", (0, True), qid="s-abstained", retrieved=("s9",)),
        _record("simple", None, generated=False, qid="s-gen-error"),
        _record("unknown", (0, True), gold=(), retrieved=("s3",), qid="u-abstained"),
        _record("unknown", (0, False), gold=(), retrieved=("s3",), qid="u-invented"),
        _record("trivia", None, judge_error="judge output not JSON", qid="o-judge-error"),
    ]


def test_means_per_type_with_abstention_and_errors() -> None:
    by_type = summarize_by_type(_hand_made())
    assert list(by_type) == ["simple", "unknown", "other"]
    simple = by_type["simple"]
    # graded 2, 2, 1, 0 (wrong), 0 (abstained): mean 5/5 = 1.0; truthfulness (2 - 1) / 5 = 0.2;
    # the generation error is counted, not scored.
    assert (simple.questions, simple.graded, simple.generation_errors) == (6, 5, 1)
    assert simple.mean_score == pytest.approx(1.0)
    assert simple.truthfulness == pytest.approx(0.2)
    assert (simple.correct, simple.partial, simple.hallucinated, simple.abstained) == (2, 1, 1, 1)
    unknown = by_type["unknown"]
    # abstaining on an unanswerable question is correct (2), inventing is wrong (0): mean 1.0.
    assert unknown.mean_score == pytest.approx(1.0)
    assert (unknown.correct, unknown.hallucinated, unknown.abstained) == (1, 1, 0)
    assert unknown.truthfulness == pytest.approx(0.0)
    other = by_type["other"]
    # only a judge error: nothing graded, no mean at all (never a 0).
    assert (other.questions, other.graded, other.judge_errors) == (1, 0, 1)
    assert other.mean_score is None
    assert other.truthfulness is None


def test_overall_excludes_judge_and_generation_errors() -> None:
    overall = summarize(_hand_made())
    # points 2+2+1+0+0 (simple) + 2+0 (unknown) = 7 over 7 graded; correct 3, wrong 2.
    assert (overall.questions, overall.graded) == (9, 7)
    assert overall.mean_score == pytest.approx(1.0)
    assert overall.truthfulness == pytest.approx((3 - 2) / 7)
    assert (overall.judge_errors, overall.generation_errors) == (1, 1)
    scored_zero = [r.question_id for r in _hand_made() if r.score == 0]
    assert "o-judge-error" not in scored_zero
    assert "s-gen-error" not in scored_zero


def test_all_judge_errors_give_no_mean() -> None:
    rows = [_record("simple", None, judge_error="truncated") for _ in range(3)]
    s = summarize(rows)
    assert (s.graded, s.judge_errors, s.mean_score, s.truthfulness) == (0, 3, None, None)


def test_strategy_report_costs_evidence_and_failures() -> None:
    rows = [
        _record("simple", (2, False), prompt=100, qid="a"),
        _record("simple", (0, False), prompt=300, retrieved=("s9",), qid="b"),
        _record("simple", None, generated=False, qid="c"),
        _record("unknown", (0, True), gold=(), qid="d"),
    ]
    report = strategy_report("rag", rows)
    # prompt tokens over the 3 answered records: (100 + 300 + 100) / 3.
    assert report.mean_prompt_tokens == pytest.approx(500 / 3)
    # evidence: a visible, b not (c failed, d has no gold): 1 / 2.
    assert report.evidence_visible_share == pytest.approx(0.5)
    assert [f.question_id for f in report.failures] == ["b", "c"]
    assert [diagnose(f) for f in report.failures] == ["retrieval_miss", "error"]
    assert report.route_counts == {"rag": 3}
    assert strategy_report("residency", rows, evidence_known=False).evidence_visible_share is None


def test_diagnose_generation_miss_and_unanswerable() -> None:
    assert diagnose(_record("detail", (1, False))) == "generation_miss"
    assert diagnose(_record("unknown", (0, False), gold=())) == "unanswerable"
    assert evidence_share([_record("unknown", (0, True), gold=())]) is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            '{"score":2,"abstained":false}', Grade(score=2, abstained=False), id="compact"
        ),
        pytest.param(
            '{ "abstained": true,\n "score": 0 }', Grade(score=0, abstained=True), id="spaced"
        ),
    ],
)
def test_parse_grade(text: str, expected: Grade) -> None:
    assert parse_grade(text, "stop") == expected


@pytest.mark.parametrize(
    ("text", "finish", "message"),
    [
        pytest.param("{\r\r\r\r\r\r", "length", "truncated at max_tokens", id="whitespace-runaway"),
        pytest.param("", "stop", "empty", id="empty"),
        pytest.param(None, "stop", "empty", id="no-content"),
        pytest.param('{"score":3,"abstained":false}', "stop", "score", id="score-out-of-range"),
        pytest.param('{"score":"2","abstained":false}', "stop", "score", id="string-score"),
        pytest.param('{"score":2}', "stop", "abstained", id="missing-key"),
        pytest.param('{"score":2,"abstained":false,"x":1}', "stop", "x", id="extra-key"),
        pytest.param("[2, false]", "stop", "schema", id="not-an-object"),
    ],
)
def test_parse_grade_failures_are_judge_errors(text: str | None, finish: str, message: str) -> None:
    with pytest.raises(JudgeError, match=message):
        parse_grade(text, finish)


@pytest.mark.parametrize(
    ("header", "ids"),
    [
        pytest.param(None, (), id="absent"),
        pytest.param("", (), id="empty"),
        pytest.param("faq%23faq-public", ("faq#faq-public",), id="one"),
        pytest.param(
            "manual%2Fops%23a,note-2025%2C1",
            ("manual/ops#a", "note-2025,1"),
            id="two-with-encoded-comma",
        ),
    ],
)
def test_parse_retrieved_header(header: str | None, ids: tuple[str, ...]) -> None:
    assert parse_retrieved_header(header) == ids


def test_load_questions_defaults_and_bad_lines(tmp_path: Path) -> None:
    good = tmp_path / "qa.jsonl"
    good.write_bytes(
        orjson.dumps({"query": "Q?", "answer": "A", "relevant_ids": ["x"]})
        + b"\n\n"
        + orjson.dumps({"id": "q2", "query": "Q2?", "answer": "B", "type": "unknown"})
        + b"\n"
    )
    first, second = load_answer_questions(good)
    assert (first.id, first.type, second.relevant_ids) == ("line 1", "other", ())
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(orjson.dumps({"id": "q1", "query": "Q?"}) + b"\n")
    with pytest.raises(CorpusError, match=r"bad.jsonl:1: answer"):
        load_answer_questions(bad)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        pytest.param({"strategies": ("rag",)}, "--generator", id="rag-without-generator"),
        pytest.param(
            {"strategies": ("residency",), "judge": "http://j"}, "--router", id="no-router"
        ),
        pytest.param(
            {"strategies": ("residency",), "router": "http://r"}, "--judge", id="no-judge"
        ),
        pytest.param({"strategies": ("rag",), "generator": "http://g", "k": 0}, "--k", id="k-zero"),
    ],
)
def test_check_job_refuses(changes: dict[str, object], message: str, tmp_path: Path) -> None:
    base: dict[str, object] = {
        "questions_path": tmp_path / "qa.jsonl",
        "questions": (),
        "index": None,
        "strategies": ("rag",),
    }
    job = AnswerEvalJob(**{**base, **changes})  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=message):
        check_job(job)
