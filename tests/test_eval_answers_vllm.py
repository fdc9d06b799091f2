"""`residency eval answers` against a real vLLM CPU server: the tiny random-weight model is both
generator and judge. Its grades are meaningless; the plumbing is real: streamed answers with
usage and cached tokens, the reference scorer on every answer, JSON-schema-constrained verdicts,
per-type aggregation, abstention rules, judge errors and generator errors that stay with their
question. (The real model's run is in test_real_model_vllm.py.)

The judge server runs with `--structured-outputs-config '{"backend": "xgrammar",
"disable_any_whitespace": true}'`: without it xgrammar lets a random model emit whitespace inside
the JSON until max_tokens (every verdict a judge_error). The index is a two-file slice of the
sample corpus (BM25 only), so the whole text fits the server's 32,768 tokens.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import orjson
import pytest
import typer
from typer.testing import CliRunner
from vllm_server import REPO_ROOT, VllmServer

from residency.cli.eval_answers import answers
from residency.eval.answers import AnswerEvalReport, AnswerRecord, judge_verdict, summarize
from residency.eval.answers.reference import is_abstention
from residency.index import IndexOptions, build_index
from residency.tokenizer import LocalTokenizer

pytestmark = pytest.mark.vllm

CORPUS = REPO_ROOT / "residency" / "data" / "corpora" / "harbor-lights"
SLICE = ("manual/overview.md", "manual/equipment.md")
PICKED = ("q001", "q014", "q040", "q066")  # simple, detail, timeline (gold not indexed), unknown
JUDGE_ARGS = (
    "--enforce-eager",
    "--enable-prompt-tokens-details",
    "--enable-prefix-caching",
    "--structured-outputs-config",
    '{"backend": "xgrammar", "disable_any_whitespace": true}',
)
MAX_TOKENS = "12"
# 90K CJK characters cycling through 20,000 mostly rare ones: each is one or more byte-level
# tokens, so the prompt exceeds max_model_len 32,768 and vLLM refuses this one question.
HUGE_QUERY = "".join(chr(0x4E00 + (i * 7919) % 20_000) for i in range(90_000))


@pytest.fixture(scope="module")
def judge_server(vllm_dense_server: VllmServer) -> VllmServer:
    """The session dense server (compact JSON structured outputs): generator and judge."""
    return vllm_dense_server


@pytest.fixture(scope="module")
def small_index(tmp_path_factory: pytest.TempPathFactory, tiny_tokenizer_dir: Path) -> Path:
    """BM25 index over two manual files of the sample corpus."""
    root = tmp_path_factory.mktemp("eval-answers")
    corpus = root / "corpus"
    for rel in SLICE:
        (corpus / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(CORPUS / "docs" / rel, corpus / rel)
    index_dir = root / "index"
    build_index(corpus, index_dir, IndexOptions(dense=False), LocalTokenizer(tiny_tokenizer_dir))
    return index_dir


@pytest.fixture(scope="module")
def questions(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Four sample questions, one of a type outside the six, one too long for the server."""
    lines = [
        line
        for line in (CORPUS / "qa.jsonl").read_bytes().splitlines()
        if orjson.loads(line)["id"] in PICKED
    ]
    extra = [
        {"id": "x-other", "query": "灯台はいくつ？", "type": "trivia", "answer": "5基です。"},
        {"id": "x-huge", "query": HUGE_QUERY, "type": "simple", "answer": "-"},
    ]
    path = tmp_path_factory.mktemp("eval-answers-qa") / "qa.jsonl"
    path.write_bytes(b"\n".join([*lines, *(orjson.dumps(e) for e in extra)]) + b"\n")
    return path


def run_cli(*args: str) -> tuple[int, str]:
    """The unregistered `answers` command in a one-command typer app."""
    app = typer.Typer()
    app.command()(answers)
    result = CliRunner().invoke(app, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout


def read_records(path: Path) -> list[AnswerRecord]:
    """Every line of a records jsonl, validated."""
    return [
        AnswerRecord.model_validate(orjson.loads(line)) for line in path.read_bytes().splitlines()
    ]


def test_rag_and_whole_graded_with_schema_output(
    judge_server: VllmServer, small_index: Path, questions: Path, tmp_path: Path
) -> None:
    records_path = tmp_path / "records.jsonl"
    code, out = run_cli(
        "--questions",
        str(questions),
        "--index",
        str(small_index),
        "--generator",
        judge_server.base_url,
        "--judge",
        judge_server.base_url,
        "--max-tokens",
        MAX_TOKENS,
        "--records",
        str(records_path),
        "--json",
    )
    assert code == 0, out
    report = AnswerEvalReport.model_validate(orjson.loads(out))
    assert [s.strategy for s in report.strategies] == ["echo", "rag-top3", "whole"]
    assert all(s.skipped is None for s in report.strategies)
    records = read_records(records_path)
    assert len(records) == 3 * 6
    echo = {r.question_id: r for r in records if r.strategy == "echo"}
    # No model: the question is the answer, scored like any other; nothing was sent.
    assert all(r.answer == r.query and r.prompt_tokens is None for r in echo.values())
    assert echo["q066"].outcome == "hallucinated"  # restating is not abstaining
    for strategy in report.strategies[1:]:
        mine = [r for r in records if r.strategy == strategy.strategy]
        by_id = {r.question_id: r for r in mine}
        # The huge question failed alone; the run went on and never scored it.
        huge = by_id["x-huge"]
        assert (huge.outcome, huge.judge_outcome) == ("generation_error", "generation_error")
        assert (huge.score, huge.judge_score) == (None, None)
        assert "HTTP 400" in (huge.generation_error or "")
        answered = [r for r in mine if r.question_id != "x-huge"]
        # Constrained output parsed for every answer: no judge error, a grade on each.
        assert [r.judge_error for r in answered] == [None] * 5
        for r in answered:
            assert r.grade is not None
            verdict = judge_verdict(r.type, r.grade)
            assert (r.judge_outcome, r.judge_score) == (verdict.outcome, verdict.score)
            # The reference scorer needs no judge: its verdict follows from the text alone.
            assert r.f1 is not None
            assert r.answer is not None
            assert (r.outcome == "correct") == (
                is_abstention(r.answer) if r.type == "unknown" else r.f1 >= 0.5
            )
            assert r.prompt_tokens is not None
            assert r.ttft_s is not None
            assert r.decode_s is not None
            assert r.completion_tokens is not None
            assert 1 <= r.completion_tokens <= int(MAX_TOKENS)
        unknown = by_id["q066"]
        assert unknown.grade is not None
        assert (unknown.judge_outcome == "correct") or not unknown.grade.abstained
        # Per-type aggregation: the six types' groups present, 'trivia' under 'other'.
        assert list(strategy.by_type) == ["simple", "detail", "timeline", "unknown", "other"]
        assert by_id["x-other"].type == "other"
        assert strategy.judge_by_type is not None
        for group, summary in strategy.by_type.items():
            assert summary == summarize(r for r in mine if r.type == group)
            assert strategy.judge_by_type[group] == summarize(
                (r for r in mine if r.type == group), "judge"
            )
        assert strategy.overall == summarize(mine)
        assert strategy.judge_overall == summarize(mine, "judge")
        assert strategy.overall.graded == 5
        assert strategy.overall.generation_errors == 1
    rag = {r.question_id: r for r in records if r.strategy == "rag-top3"}
    whole = {r.question_id: r for r in records if r.strategy == "whole"}
    assert all(1 <= len(r.retrieved_ids) <= 3 for r in rag.values())
    assert whole["q001"].evidence_visible is True  # both gold sections are in the slice
    assert whole["q040"].evidence_visible is False  # its gold notes are not indexed
    assert whole["q066"].evidence_visible is None  # nothing to find
    # The whole text is one shared prefix: after the first question it comes from the cache.
    assert whole["q014"].cached_tokens is not None
    assert whole["q014"].cached_tokens > 0
    assert (whole["q014"].prompt_tokens or 0) > 4 * (rag["q014"].prompt_tokens or 0)
    assert any("gold id(s) are not sections" in n for n in report.notes)


def test_unparsable_verdicts_are_judge_errors_not_zeros(
    judge_server: VllmServer, small_index: Path, questions: Path
) -> None:
    # 5 tokens cannot hold '{"score":0,"abstained":false}' (~25): truncated real output.
    code, out = run_cli(
        "--questions",
        str(questions),
        "--index",
        str(small_index),
        "--generator",
        judge_server.base_url,
        "--judge",
        judge_server.base_url,
        "--strategy",
        "rag",
        "--max-tokens",
        MAX_TOKENS,
        "--judge-max-tokens",
        "5",
        "--limit",
        "2",
    )
    assert code == 0, out
    assert "rag-top3: 2 judge answer(s) could not be used (judge_error)" in out
    assert "truncated at max_tokens" in out


def test_whole_over_max_model_len_is_skipped_with_one_line(
    judge_server: VllmServer, small_index: Path, questions: Path
) -> None:
    code, out = run_cli(
        "--questions",
        str(questions),
        "--index",
        str(small_index),
        "--generator",
        judge_server.base_url,
        "--strategy",
        "whole",
        "--max-tokens",
        "30000",
        "--json",
    )
    assert code == 0, out
    report = AnswerEvalReport.model_validate(orjson.loads(out))
    (whole,) = report.strategies
    assert whole.skipped is not None
    assert "max_model_len 32,768" in whole.skipped
    assert "--max-tokens 30000" in whole.skipped
    assert whole.overall.questions == 0
