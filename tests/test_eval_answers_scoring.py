"""Answer-eval scoring on hand-made records: the reference scorer (token F1, abstention), the
judge's verdicts, means per type, errors.

Every expected value is computed by hand in the test's comment; records go through the same
`build_record` the run uses, so outcome and points come from the real rules.
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from residency_cli import run_cli

from residency.errors import ConfigError, CorpusError
from residency.eval.answers import (
    STRATEGIES,
    AnswerEvalJob,
    AnswerEvalOptions,
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
from residency.eval.answers.generate import Attempt, parse_retrieved_header
from residency.eval.answers.reference import (
    is_abstention,
    key_fact_f1,
    score_reference,
    token_f1,
    token_recall,
)
from residency.eval.answers.report import build_record, strategy_report
from residency.eval.answers.run import check_job
from residency.eval.answers.scoring import diagnose, evidence_share, evidence_visible
from residency.vllm_client import StreamedAnswer


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


REFERENCE = "Kanzaki Lighthouse has the FS-20 fog signal."
# What each hand-made answer scores against REFERENCE (tokens: kanzaki lighthouse has fs 20 fog
# signal = 7): the verdict is set by the answer's text, as in a run.
ANSWERS = {
    "right": "Kanzaki Lighthouse has the FS-20 fog signal.",  # F1 1.0 -> correct
    "half": "Kanzaki Lighthouse.",  # 2 shared: P 1, R 2/7, F1 4/9 = .44 -> partial
    "wrong": "Akamazaki uses a horn.",  # nothing shared -> hallucinated
    "abstain": "The documents do not say.",  # nothing shared, an abstention -> abstained
}


def _record(
    qtype: str,
    grade: tuple[int, bool] | None,
    *,
    text: str = "right",
    judged: bool = True,
    judge_error: str | None = None,
    generated: bool = True,
    gold: tuple[str, ...] = ("s1",),
    retrieved: tuple[str, ...] = ("s1",),
    prompt: int = 100,
    qid: str = "q",
) -> AnswerRecord:
    question = AnswerQuestion(id=qid, query="Q?", relevant_ids=gold, type=qtype, answer=REFERENCE)
    answer = _answer(ANSWERS[text], prompt=prompt) if generated else None
    attempt = Attempt(
        answer,
        None if generated else "HTTP 400: too long",
        "rag",
        retrieved,
        evidence_visible(gold, retrieved),
        0.01,
    )
    parsed = None if grade is None else Grade(score=grade[0], abstained=grade[1])  # type: ignore[arg-type]
    return build_record("rag-top3", "rag", question, attempt, parsed, judge_error, judged)


def _hand_made() -> list[AnswerRecord]:
    return [
        _record("simple", (2, False), qid="s-correct-1"),
        _record("simple", (2, False), qid="s-correct-2"),
        _record("simple", (1, False), text="half", qid="s-partial"),
        _record("simple", (0, False), text="wrong", qid="s-wrong", retrieved=("s9",)),
        _record("simple", (0, True), text="abstain", qid="s-abstained", retrieved=("s9",)),
        _record("simple", None, generated=False, qid="s-gen-error"),
        _record("unknown", (0, True), text="abstain", gold=(), retrieved=("s3",), qid="u-abst"),
        _record("unknown", (0, False), text="wrong", gold=(), retrieved=("s3",), qid="u-invented"),
        _record("trivia", None, judge_error="judge output not JSON", qid="o-judge-error"),
    ]


def test_means_per_type_with_abstention_and_errors() -> None:
    by_type = summarize_by_type(_hand_made(), "judge")
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
    overall = summarize(_hand_made(), "judge")
    # points 2+2+1+0+0 (simple) + 2+0 (unknown) = 7 over 7 graded; correct 3, wrong 2.
    assert (overall.questions, overall.graded) == (9, 7)
    assert overall.mean_score == pytest.approx(1.0)
    assert overall.truthfulness == pytest.approx((3 - 2) / 7)
    assert (overall.judge_errors, overall.generation_errors) == (1, 1)
    assert overall.mean_f1 is None  # F1 belongs to the reference scorer
    scored_zero = [r.question_id for r in _hand_made() if r.judge_score == 0]
    assert "o-judge-error" not in scored_zero
    assert "s-gen-error" not in scored_zero


def test_reference_scorer_over_the_same_records() -> None:
    overall = summarize(_hand_made())
    # The texts decide: right 2, right 2, half 1, wrong 0, abstain 0 (simple); abstain 2,
    # wrong 0 (unknown); the judge error's answer is "right": 2 — the reference scorer needs
    # no judge. 8 graded (the generation error is not), points 9: mean 9/8; correct 4
    # (s-correct-1, s-correct-2, u-abst, o-judge-error), hallucinated 2 (s-wrong, u-invented).
    assert (overall.questions, overall.graded, overall.generation_errors) == (9, 8, 1)
    assert overall.judge_errors == 0
    assert overall.mean_score == pytest.approx(9 / 8)
    assert (overall.correct, overall.partial, overall.hallucinated, overall.abstained) == (
        4,
        1,
        2,
        1,
    )
    assert overall.truthfulness == pytest.approx((4 - 2) / 8)
    # F1 over answered answerable records: 1, 1, 4/9, 0, 0 (simple) and 1 (other).
    assert overall.mean_f1 == pytest.approx((1 + 1 + 4 / 9 + 0 + 0 + 1) / 6)


def test_all_judge_errors_give_no_mean() -> None:
    rows = [_record("simple", None, judge_error="truncated") for _ in range(3)]
    s = summarize(rows, "judge")
    assert (s.graded, s.judge_errors, s.mean_score, s.truthfulness) == (0, 3, None, None)


def test_without_a_judge_the_judge_fields_stay_empty() -> None:
    row = _record("simple", None, judged=False)
    assert (row.grade, row.judge_outcome, row.judge_score, row.judge_error) == (None,) * 4
    assert (row.outcome, row.score, row.f1) == ("correct", 2, 1.0)
    report = strategy_report("rag-top3", "rag", [row])
    assert report.judge_overall is None
    assert report.judge_by_type is None


def test_strategy_report_costs_evidence_and_failures() -> None:
    rows = [
        _record("simple", (2, False), prompt=100, qid="a"),
        _record("simple", (0, False), prompt=300, retrieved=("s9",), qid="b"),
        _record("simple", None, generated=False, qid="c"),
        _record("unknown", (0, True), gold=(), qid="d"),
    ]
    rows[1] = _record("simple", (0, False), text="wrong", prompt=300, retrieved=("s9",), qid="b")
    rows[3] = _record("unknown", (0, True), text="abstain", gold=(), qid="d")
    report = strategy_report("rag-top3", "rag", rows, k=3, judged=True)
    assert (report.strategy, report.kind, report.k) == ("rag-top3", "rag", 3)
    # prompt tokens over the 3 answered records: (100 + 300 + 100) / 3.
    assert report.mean_prompt_tokens == pytest.approx(500 / 3)
    # evidence: a visible, b not (c failed, d has no gold): 1 / 2.
    assert report.evidence_visible_share == pytest.approx(0.5)
    # quality follows evidence: a (seen) scored 2, b (unseen) 0.
    assert (report.score_evidence_visible, report.score_evidence_missing) == (2.0, 0.0)
    assert [f.question_id for f in report.failures] == ["b", "c"]
    assert [diagnose(f) for f in report.failures] == ["retrieval_miss", "error"]
    assert report.route_counts == {"rag": 3}
    unknown = strategy_report("residency", "residency", rows, evidence_known=False)
    assert unknown.evidence_visible_share is None
    assert unknown.score_evidence_visible is None


def test_diagnose_generation_miss_and_unanswerable() -> None:
    assert diagnose(_record("detail", (1, False), text="half")) == "generation_miss"
    assert diagnose(_record("unknown", (0, False), text="wrong", gold=())) == "unanswerable"
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
        pytest.param({"strategy": ["rag"]}, "--generator", id="rag-without-generator"),
        pytest.param({"strategy": ["residency"], "judge": "http://j"}, "--router", id="no-router"),
        pytest.param(
            {"strategy": ["rag"], "generator": "http://g", "judge_model": "m"},
            "--judge",
            id="judge-model-without-judge",
        ),
    ],
)
def test_check_job_refuses(changes: dict[str, object], message: str, tmp_path: Path) -> None:
    job = AnswerEvalJob(
        questions_path=tmp_path / "qa.jsonl",
        questions=(),
        index=None,  # type: ignore[arg-type]
        options=AnswerEvalOptions.model_validate(changes),
    )
    with pytest.raises(ConfigError, match=message):
        check_job(job)


def test_strategies_any_case_once_each_and_the_defaults() -> None:
    given = AnswerEvalOptions(strategy=["RAG", " echo", "rag"], k=[5, 3, 5])
    assert (given.strategies, given.ks) == (("rag", "echo"), (5, 3))
    assert AnswerEvalOptions().strategies == ("echo", "rag", "whole")
    assert AnswerEvalOptions(router="http://r").strategies == STRATEGIES
    assert AnswerEvalOptions().ks == (3,)


@pytest.mark.parametrize(
    ("args", "start"),
    [
        pytest.param(("--rag-k", "3", "--rag-k", "0"), "--rag-k[1]: ", id="k-zero"),
        pytest.param(("--max-tokens", "0"), "--max-tokens: ", id="max-tokens-zero"),
        pytest.param(("--judge-max-tokens", "-1"), "--judge-max-tokens: ", id="judge-negative"),
        pytest.param(("--limit", "0"), "--limit: ", id="limit-zero"),
        pytest.param(("--strategy", "nope"), "--strategy[0]: ", id="unknown-strategy"),
    ],
)
def test_cli_refused_value_is_one_line_naming_the_flag(args: tuple[str, ...], start: str) -> None:
    """The field's bounds and choices, checked by bind before any file is read: exit 1."""
    out = run_cli("eval", "answers", *args)
    assert out.returncode == 1, out.stdout + out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"error: {start}"), lines
    assert f"got {args[-1]}" in lines[0] or f"got '{args[-1]}'" in lines[0], lines


@pytest.mark.parametrize(
    ("answer", "reference", "f1", "recall"),
    [
        # the worked example of reference.py: 6 of 7 tokens shared both ways.
        pytest.param(
            "The Kanzaki Lighthouse has the FS-20 fog signal.",
            "Only Kanzaki Lighthouse (fog signal FS-20).",
            6 / 7,
            6 / 7,
            id="worked-example",
        ),
        # articles, case and punctuation do not count: identical after normalisation.
        pytest.param("THE answer: 12 nm!", "answer 12 nm", 1.0, 1.0, id="normalised"),
        # verbose: both reference tokens among 9: P 2/9, R 1, F1 2*(2/9)/(11/9) = 4/11.
        pytest.param("It is 12 nm as far as I know", "12 nm", 4 / 11, 1.0, id="verbose"),
        # Japanese by character: 内線200です vs 内線200: answer 内,線,200,で,す (5), reference
        # 内,線,200 (3); shared 3: P 3/5, R 1, F1 .75.
        pytest.param("内線200です。", "内線200", 0.75, 1.0, id="japanese-chars"),
        # repeated tokens count once per occurrence in both (multiset): "lamp lamp" vs "lamp".
        pytest.param("lamp lamp", "lamp", 2 * 0.5 * 1 / 1.5, 1.0, id="multiset"),
        pytest.param("", "lamp", 0.0, 0.0, id="empty-answer"),
    ],
)
def test_token_f1_and_recall(answer: str, reference: str, f1: float, recall: float) -> None:
    assert token_f1(answer, reference) == pytest.approx(f1)
    assert token_recall(answer, reference) == pytest.approx(recall)


@pytest.mark.parametrize(
    ("answer", "abstained"),
    [
        pytest.param("The documents do not say.", True, id="instructed-phrase"),
        pytest.param("The text doesn't mention the cost.", True, id="doesnt-mention"),
        pytest.param("This is not stated in the documents.", True, id="not-stated"),
        pytest.param("There is no information about drones.", True, id="no-information"),
        pytest.param("I cannot find that in the text.", True, id="cannot-find"),
        pytest.param("I don't know.", True, id="dont-know"),
        pytest.param("本文には記載がありません。", True, id="ja-kisai"),
        pytest.param("文書には書かれていません", True, id="ja-kakarete"),
        pytest.param("The fog signal is an FS-20.", False, id="an-answer"),
        pytest.param("The lamp did not fail; it was replaced.", False, id="negation-is-not-enough"),
        pytest.param("神崎灯台です。", False, id="ja-answer"),
    ],
)
def test_abstention_detector(answer: str, abstained: bool) -> None:
    assert is_abstention(answer) is abstained


LONGER = REFERENCE + " It was installed in 1998."  # 12 tokens


@pytest.mark.parametrize(
    ("group", "answer", "reference", "outcome", "points"),
    [
        pytest.param("simple", ANSWERS["right"], REFERENCE, "correct", 2, id="f1-1"),
        pytest.param("simple", ANSWERS["half"], REFERENCE, "partial", 1, id="f1-0.44"),
        # 1 of 7 shared: P 1, R 1/7, F1 .25 >= PARTIAL_F1 .2.
        pytest.param("simple", "Kanzaki.", REFERENCE, "partial", 1, id="f1-0.25"),
        # 1 of 12 shared: F1 2/13 = .15 < .2.
        pytest.param("simple", "Kanzaki.", LONGER, "hallucinated", 0, id="f1-0.15"),
        pytest.param("detail", ANSWERS["abstain"], REFERENCE, "abstained", 0, id="abstained"),
        pytest.param("unknown", ANSWERS["abstain"], REFERENCE, "correct", 2, id="unknown-abst"),
        pytest.param("unknown", ANSWERS["right"], REFERENCE, "hallucinated", 0, id="unknown-ans"),
    ],
)
def test_reference_verdict(
    group: str, answer: str, reference: str, outcome: str, points: int
) -> None:
    verdict = score_reference(group, answer, reference)
    assert (verdict.outcome, verdict.score) == (outcome, points)


QUESTION = "When was the Kanzaki lighthouse lamp replaced?"
FACT_REFERENCE = "The Kanzaki lighthouse lamp was replaced in March 1987."


@pytest.mark.parametrize(
    ("answer", "fact_f1", "plain_at_least"),
    [
        # The question as its own answer: plain F1 credits 5 shared words, key facts nothing.
        pytest.param(QUESTION, 0.0, 0.5, id="echo"),
        # Only the facts: 'march 1987' against the reference's new tokens [in, march, 1987].
        pytest.param("March 1987.", 0.8, 0.3, id="facts-only"),
        # [it, in, march, 1987] against [in, march, 1987]: P 3/4, R 1, F1 6/7.
        pytest.param("It was replaced in March 1987.", 6 / 7, 0.5, id="restated-with-facts"),
        # [it, in, june, 1990]: only 'in' shared: P 1/4, R 1/3, F1 2/7; plain F1 still 0.43.
        pytest.param("It was replaced in June 1990.", 2 / 7, 0.4, id="wrong-date"),
    ],
)
def test_key_fact_f1_credits_only_tokens_not_in_the_question(
    answer: str, fact_f1: float, plain_at_least: float
) -> None:
    assert key_fact_f1(answer, FACT_REFERENCE, QUESTION) == pytest.approx(fact_f1)
    assert token_f1(answer, FACT_REFERENCE) >= plain_at_least


def test_echo_scores_zero_by_key_facts_but_not_by_plain_f1() -> None:
    verdict = score_reference("simple", QUESTION, FACT_REFERENCE, QUESTION)
    assert (verdict.outcome, verdict.score) == ("correct", 2)  # what made echo look good
    assert (verdict.fact_outcome, verdict.fact_score) == ("hallucinated", 0)


def test_key_facts_fall_back_to_plain_f1_when_the_reference_only_restates() -> None:
    question = "Is the lamp electric?"
    assert key_fact_f1("Yes, the lamp is electric.", "The lamp is electric.", question) == (
        pytest.approx(token_f1("Yes, the lamp is electric.", "The lamp is electric."))
    )
