"""Retrieval eval: hand-computed metrics, budgets, questions files, and the CLI with history."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from residency_cli import run_cli

from residency.errors import ConfigError, CorpusError
from residency.eval.questions import load_questions
from residency.eval.retrieval import (
    Budget,
    evaluate_retrieval,
    mean_metrics,
    mrr_at_k,
    ndcg_at_k,
    parse_budget,
    question_metrics,
    recall_at_k,
)
from residency.index import IndexOptions, build_index, open_index
from residency.tokenizer import ApproxTokenizer

RANKED = ["a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k"]


@pytest.mark.parametrize(
    ("relevant", "expected"),
    [
        # c at rank 3: recall jumps at k=3, RR 1/3, DCG 1/log2(4) = 0.5 over ideal 1.
        pytest.param({"c"}, (0.0, 1.0, 1.0, 1.0, 1 / 3, 0.5), id="one-at-rank-3"),
        # a at 1, d at 4: DCG 1 + 1/log2(5) = 1.430677, ideal 1 + 1/log2(3) = 1.630930.
        pytest.param({"a", "d"}, (0.5, 0.5, 1.0, 1.0, 1.0, 0.877215), id="two-at-1-and-4"),
        # k at rank 11: outside every cut-off.
        pytest.param({"k"}, (0.0, 0.0, 0.0, 0.0, 0.0, 0.0), id="rank-11"),
        pytest.param({"zz"}, (0.0, 0.0, 0.0, 0.0, 0.0, 0.0), id="missing"),
        # 2 relevant, one found at rank 2: recall 0.5, nDCG (1/log2 3) / 1.630930 = 0.386853.
        pytest.param({"b", "zz"}, (0.0, 0.5, 0.5, 0.5, 0.5, 0.386853), id="half-found"),
    ],
)
def test_metrics_hand_computed(relevant: set[str], expected: tuple[float, ...]) -> None:
    got = (
        recall_at_k(RANKED, relevant, 1),
        recall_at_k(RANKED, relevant, 3),
        recall_at_k(RANKED, relevant, 5),
        recall_at_k(RANKED, relevant, 10),
        mrr_at_k(RANKED, relevant, 10),
        ndcg_at_k(RANKED, relevant, 10),
    )
    assert got == pytest.approx(expected, abs=1e-6)
    assert question_metrics(RANKED, relevant)["ndcg_at_10"] == pytest.approx(expected[5], abs=1e-6)


def test_ndcg_of_a_perfect_ranking_is_one() -> None:
    assert ndcg_at_k(["a", "b", "c"], {"a", "b"}, 10) == pytest.approx(1.0)
    assert math.isclose(ndcg_at_k(["x", "a"], {"a"}, 10), 1 / math.log2(3))


def test_mean_metrics_averages_questions() -> None:
    rows = [question_metrics(RANKED, {"a"}), question_metrics(RANKED, {"c"})]
    mean = mean_metrics(rows)
    assert mean.questions == 2
    assert (mean.recall_at_1, mean.recall_at_3) == (0.5, 1.0)
    assert mean.mrr_at_10 == pytest.approx((1 + 1 / 3) / 2)
    assert mean_metrics([]).recall_at_10 == 0.0


@pytest.mark.parametrize(
    ("text", "metric", "minimum"),
    [
        pytest.param("R@10=0.80", "R@10", 0.8, id="recall"),
        pytest.param("r@3 = 0.5", "R@3", 0.5, id="case-and-spaces"),
        pytest.param("mrr@10=0.7", "MRR@10", 0.7, id="mrr"),
        pytest.param("NDCG@10=1", "nDCG@10", 1.0, id="ndcg"),
    ],
)
def test_parse_budget(text: str, metric: str, minimum: float) -> None:
    assert parse_budget(text) == Budget(metric=metric, minimum=minimum)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        pytest.param("R@7=0.8", "METRIC one of R@1, R@3", id="unknown-k"),
        pytest.param("recall=0.8", "expected METRIC=VALUE", id="no-k"),
        pytest.param("R@10=1.5", "outside [0, 1]", id="above-one"),
    ],
)
def test_bad_budgets_name_the_flag(text: str, fragment: str) -> None:
    with pytest.raises(ConfigError, match=r"--min-recall") as info:
        parse_budget(text)
    assert fragment in str(info.value)


@pytest.mark.parametrize(
    ("lines", "fragment"),
    [
        pytest.param(
            ['{"query": "q", "relevant_ids": []}', "{oops"], ":2: invalid JSON", id="json"
        ),
        pytest.param(['{"relevant_ids": ["a"]}'], ":1: query: Field required", id="no-query"),
        pytest.param(['{"query": "q"}'], ":1: relevant_ids: Field required", id="no-relevant"),
        pytest.param([""], "holds no questions", id="empty"),
    ],
)
def test_bad_questions_files_name_file_and_line(
    tmp_path: Path, lines: list[str], fragment: str
) -> None:
    path = tmp_path / "qa.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(CorpusError, match=fragment) as info:
        load_questions(path)
    assert str(path) in str(info.value)


CORPUS = {
    "manual.md": "# 手引き\n\n## 灯器 {#lamp}\n\n灯器は毎朝点検する。\n\n"
    "## 蓄電池 {#battery}\n\n蓄電池は4個まとめて交換する。\n\n"
    "## 回廊 {#gallery}\n\n回廊の作業は強風で中止する。\n",
    "notes.jsonl": json.dumps(
        {"id": "note-1", "text": "鵜ノ島で電圧が下がった。"}, ensure_ascii=False
    )
    + "\n",
}
QUESTIONS = [
    {
        "id": "q1",
        "query": "灯器はいつ点検する？",
        "relevant_ids": ["manual#lamp"],
        "type": "simple",
    },
    {
        "id": "q2",
        "query": "蓄電池は何個交換する？",
        "relevant_ids": ["manual#battery"],
        "type": "simple",
    },
    {"id": "q3", "query": "電圧が下がったのはどこ", "relevant_ids": ["note-1"], "type": "detail"},
    {"id": "q4", "query": "食堂は何時に開く", "relevant_ids": [], "type": "unknown"},
    {"query": "灯台の歴史", "relevant_ids": ["history#gone"]},
]


@pytest.fixture(scope="module")
def bm25_index(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(index dir, questions file) of a BM25-only index over a tiny corpus."""
    base = tmp_path_factory.mktemp("eval")
    (base / "docs").mkdir()
    for rel, text in CORPUS.items():
        (base / "docs" / rel).write_text(text, encoding="utf-8")
    build_index(base / "docs", base / "idx", IndexOptions(dense=False), ApproxTokenizer())
    qa = base / "qa.jsonl"
    qa.write_text("".join(json.dumps(q, ensure_ascii=False) + "\n" for q in QUESTIONS))
    return base / "idx", qa


def test_evaluate_reports_each_retriever_per_type_and_exclusions(
    bm25_index: tuple[Path, Path],
) -> None:
    index, qa = bm25_index
    report = evaluate_retrieval(
        open_index(index), qa, load_questions(qa), [parse_budget("R@10=0.7")]
    )
    assert set(report.retrievers) == {"bm25", "hybrid"}
    assert (report.questions_total, report.evaluated, report.excluded_no_relevant) == (5, 4, 1)
    assert report.unknown_relevant_ids == ("history#gone",)
    bm25 = report.retrievers["bm25"]
    assert set(bm25.by_type) == {"simple", "detail", "untyped"}
    assert bm25.by_type["simple"].recall_at_1 == 1.0
    assert bm25.by_type["untyped"].recall_at_10 == 0.0  # its gold id is not in the index
    assert bm25.overall.recall_at_10 == 0.75
    assert report.budgets[0].actual == report.retrievers["hybrid"].overall.recall_at_10
    assert report.budgets[0].passed
    assert len(report.manifest_hash) == 64


def test_cli_eval_appends_history_and_enforces_budgets(
    bm25_index: tuple[Path, Path], tmp_path: Path
) -> None:
    index, qa = bm25_index
    history = tmp_path / "hist.jsonl"
    ok = run_cli(
        "eval",
        "retrieval",
        "--index",
        str(index),
        "--questions",
        str(qa),
        "--history",
        str(history),
        "--min-recall",
        "R@10=0.5",
        "--json",
    )
    assert ok.returncode == 0, ok.stderr
    report = json.loads(ok.stdout)
    assert report["retrievers"]["hybrid"]["overall"]["recall_at_10"] == 0.75
    missed = run_cli(
        "eval",
        "retrieval",
        "--index",
        str(index),
        "--questions",
        str(qa),
        "--history",
        str(history),
        "--min-recall",
        "R@10=0.9",
        "--min-recall",
        "MRR@10=0.1",
    )
    assert missed.returncode == 2
    assert "budget missed: hybrid R@10 = 0.7500 < 0.90 (--min-recall R@10=0.9)" in missed.stderr
    assert "MRR@10" not in missed.stderr  # that one passed
    assert "R@10" in missed.stdout  # the table is printed all the same
    assert "not sections of this index" in missed.stdout
    assert "1 question(s) without relevant ids" in missed.stdout
    records = [json.loads(line) for line in history.read_text().splitlines()]
    assert len(records) == 2  # a missed budget is still recorded
    assert records[1]["budgets"][0] == {"metric": "R@10", "minimum": 0.9, "actual": 0.75}
    assert records[0]["manifest_hash"] == records[1]["manifest_hash"]


def test_cli_eval_default_history_lives_in_the_index(
    bm25_index: tuple[Path, Path], tmp_path: Path
) -> None:
    index, qa = bm25_index
    out = run_cli(
        "eval", "retrieval", "--index", str(index), "--questions", str(qa), "--weight", "bm25=1"
    )
    assert out.returncode == 0, out.stderr
    assert (index / "eval-history.jsonl").is_file()
    assert "weights bm25 1" in out.stdout


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        pytest.param(["--min-recall", "R@7=0.5"], "--min-recall 'R@7=0.5'", id="bad-budget"),
        pytest.param(["--index", "nowhere"], "is not a residency index", id="no-index"),
        # the field's bound, checked by bind before the index is opened: the flag, key, value
        pytest.param(
            ["--weight", "dense=-0.5"],
            "error: --weight[dense]: input should be greater than or equal to 0, got '-0.5'",
            id="negative-weight",
        ),
        pytest.param(["--weight", "dense"], "--weight 'dense': expected NAME=VALUE", id="no-="),
        pytest.param(["--weight", "sparse=1"], "--weight sparse: not a fused", id="unknown-name"),
    ],
)
def test_cli_eval_errors_are_one_line(
    bm25_index: tuple[Path, Path], args: list[str], fragment: str
) -> None:
    index, qa = bm25_index
    base = ["eval", "retrieval", "--index", str(index), "--questions", str(qa)]
    out = run_cli(*base, *args)
    assert out.returncode == 1
    assert fragment in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "Traceback" not in out.stderr
