"""Coverage evaluation on a hand-made corpus (real files, a real BM25-only index), hand-computed
expected coverage, and `residency eval coverage` through the real console entry point."""

from __future__ import annotations

import datetime as dt
import inspect
import json
import subprocess
from pathlib import Path

import orjson
import pytest
from residency_cli import run_cli
from vllm_server import VllmServer

from residency.context.routing import DEFAULT_K, RoutedQuestion, RoutingSettings
from residency.eval.coverage import (
    ResidentSet,
    evaluate_coverage,
    question_outcome,
    rank_queries,
)
from residency.eval.questions import Question
from residency.index import Index, IndexOptions, build_index, open_index
from residency.planning.build import PlanOptions, build_plan, log_mass
from residency.planning.plan_model import CapacitySnapshot, ResidencyPlan, write_plan
from residency.planning.prefix import render_passage
from residency.query_log import LogEntry
from residency.tokenizer import LocalTokenizer

SECTIONS = {
    "alarm": ("警報", "警報が鳴ったら当番は十五分以内に監視室へ連絡し、主灯の状態を確認する。"),
    "wind": ("強風", "風速十五メートルを超えたら屋外作業を中止し、雷鳴から三十分は再開しない。"),
    "battery": ("蓄電池", "蓄電池は五年ごとに交換し、交換後は電圧を記録簿に書く。"),
    "boat": ("作業船", "作業船は波高一メートル以下でのみ出航し、救命胴衣を必ず着用する。"),
    "paint": ("塗装", "灯塔の塗装は十年ごとに行い、色は白と赤の二色とする。"),
    # 460 characters: two chunks (log::c1, log::c2) at the default 256-character chunks.
    "log": ("保守記録", "".join(f"第{i}項。保守記録の詳細な手順をここに書く。" for i in range(20))),
}
# (query, gold, type, the top two chunks the BM25 index ranks for it).
QUESTIONS = [
    ("警報が鳴ったら当番は何分以内に連絡する", "alarm", "simple", ("alarm::c1", "wind::c1")),
    ("風速何メートルで屋外作業を中止する", "wind", "simple", ("wind::c1", "boat::c1")),
    ("蓄電池は何年ごとに交換する", "battery", "simple", ("battery::c1", "paint::c1")),
    ("作業船が出航できる波高は", "boat", "detail", ("boat::c1", "wind::c1")),
    # Its evidence (boat) ranks second, behind a resident section: margin 0 misroutes it.
    ("雷鳴のあと屋外作業を再開できるのは何分後", "boat", "detail", ("wind::c1", "boat::c1")),
    # Gold 'log' is partly resident (log::c1); the non-resident part ranks first.
    ("保守記録の第18項", "log", "detail", ("log::c2", "log::c1")),
]
UNKNOWN = Question(query="灯台守の給料はいくらか", relevant_ids=(), type="unknown")
RESIDENT = frozenset({"alarm::c1", "wind::c1", "log::c1"})


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: Path) -> Path:
    root = tmp_path_factory.mktemp("coverage")
    (root / "docs").mkdir()
    records = [orjson.dumps({"id": k, "title": t, "text": x}) for k, (t, x) in SECTIONS.items()]
    (root / "docs" / "manual.jsonl").write_bytes(b"\n".join(records) + b"\n")
    qa = [
        orjson.dumps({"query": q, "relevant_ids": [g], "type": t, "id": f"q{i}"})
        for i, (q, g, t, _) in enumerate(QUESTIONS)
    ]
    qa.append(orjson.dumps(UNKNOWN.model_dump()))
    (root / "qa.jsonl").write_bytes(b"\n".join(qa) + b"\n")
    counter = LocalTokenizer(tokenizer_dir)
    build_index(root / "docs", root / "index", IndexOptions(dense=False), counter)
    return root


@pytest.fixture(scope="module")
def index(corpus: Path) -> Index:
    return open_index(corpus / "index")


def questions() -> list[Question]:
    qs = [Question(query=q, relevant_ids=(g,), type=t) for q, g, t, _ in QUESTIONS]
    return [*qs, UNKNOWN]


def chunk_tokens(index: Index, encoder: LocalTokenizer, chunk_id: str) -> int:
    """Tokens a retrieved chunk adds, written out by hand: header line (with the record's file
    and line as its source), text, separator."""
    sid = chunk_id.split("::")[0]
    chunk = next(c for c in index.chunks if c.id == chunk_id)
    source = f"manual.jsonl:{list(SECTIONS).index(sid) + 1}"
    return encoder.count(f"[id: {sid}] {SECTIONS[sid][0]} [source: {source}]\n{chunk.text}") + 1


def test_the_hand_made_corpus_ranks_as_the_expectations_assume(index: Index) -> None:
    assert [c.id for c in index.chunks_of("log")] == ["log::c1", "log::c2"]
    for query, _, _, top_two in QUESTIONS:
        assert tuple(h.id for h in index.search_chunks(query, 2)) == top_two, query
    # The log question's second section is the third chunk (the top sections' case).
    assert index.search_chunks(QUESTIONS[-1][0], 3)[2].id == "battery::c1"


# Expected per case: (covered, in prefix, retrieved, route-resident, misrouted, added chunk ids).
# margin 0 trusts a resident top hit; margin 1 also wants the runner-up resident; the hedge adds
# the best non-resident chunk even on the resident route. Spread 0 (no top sections) unless the
# case says otherwise.
CASES = [
    pytest.param(
        RESIDENT,
        1,
        0,
        0,
        (5, 3, 2, 3, 1, ["battery::c1", "boat::c1", "log::c2"]),
        id="resident-k1-margin0-no-hedge",
    ),
    pytest.param(
        RESIDENT,
        1,
        0,
        1,
        (6, 3, 3, 3, 0, ["boat::c1", "boat::c1", "battery::c1", "boat::c1", "boat::c1", "log::c2"]),
        id="resident-k1-margin0-hedge1",
    ),
    pytest.param(
        RESIDENT,
        1,
        1,
        0,
        (6, 3, 3, 1, 0, ["boat::c1", "battery::c1", "boat::c1", "boat::c1", "log::c2"]),
        id="resident-k1-margin1-no-hedge",
    ),
    pytest.param(
        RESIDENT,
        1,
        1,
        1,
        (6, 3, 3, 1, 0, ["boat::c1", "boat::c1", "battery::c1", "boat::c1", "boat::c1", "log::c2"]),
        id="resident-k1-margin1-hedge1",
    ),
    pytest.param(
        frozenset(),
        1,
        1,
        1,
        (
            5,
            0,
            5,
            0,
            0,
            ["alarm::c1", "wind::c1", "battery::c1", "boat::c1", "wind::c1", "log::c2"],
        ),
        id="rag-top1",
    ),
    pytest.param(
        frozenset(),
        2,
        1,
        1,
        (6, 0, 6, 0, 0, [c for _, _, _, two in QUESTIONS for c in two]),
        id="rag-top2",
    ),
]
# The top two sections shown wherever they live: the misrouted question's evidence (boat, ranked
# second behind a resident section) is added on the resident route, and so are battery's runner-up
# paint and the log question's second section, battery (third chunk, after log's two); sections
# the prefix already shows (alarm, wind, log) add nothing.
SPREAD_CASES = [
    pytest.param(
        RESIDENT,
        1,
        0,
        0,
        (
            6,
            3,
            3,
            3,
            0,
            [
                "boat::c1",
                "battery::c1",
                "paint::c1",
                "boat::c1",
                "boat::c1",
                "log::c2",
                "battery::c1",
            ],
        ),
        id="resident-k1-margin0-no-hedge-spread2",
    ),
    pytest.param(
        frozenset(),
        1,
        1,
        1,
        (
            5,
            0,
            5,
            0,
            0,
            ["alarm::c1", "wind::c1", "battery::c1", "boat::c1", "wind::c1", "log::c2"],
        ),
        id="rag-top1-shows-no-top-sections",
    ),
]


@pytest.mark.parametrize(
    ("resident", "k", "margin", "hedge", "expected", "spread"),
    [
        *[pytest.param(*c.values, 0, id=c.id) for c in CASES],
        *[pytest.param(*c.values, 2, id=c.id) for c in SPREAD_CASES],
    ],
)
def test_coverage_hand_computed(
    index: Index,
    encoder: LocalTokenizer,
    resident: frozenset[str],
    k: int,
    margin: int,
    hedge: int,
    expected: tuple[int, int, int, int, int, list[str]],
    spread: int,
) -> None:
    covered, in_prefix, retrieved, route_resident, misrouted, added = expected
    rows = [ResidentSet("case", "planner" if resident else "rag", resident, 0, 0, k)]
    routing = RoutingSettings(margin=margin, hedge=hedge, hops=1, spread=spread)
    report = evaluate_coverage(index, questions(), rows, encoder, source="test", routing=routing)
    m = report.results[0].overall
    n = len(QUESTIONS)
    assert report.evaluated == n
    assert report.excluded_no_relevant == 1
    assert m.questions == n
    assert m.coverage == pytest.approx(covered / n)
    assert m.resident_share == pytest.approx(in_prefix / n)
    assert m.retrieved_share == pytest.approx(retrieved / n)
    assert m.long_tail_questions == n - in_prefix
    assert m.long_tail_recall == pytest.approx(retrieved / (n - in_prefix))
    assert m.route_resident_share == pytest.approx(route_resident / n)
    assert m.misrouted == misrouted
    assert m.mean_added_chunks == pytest.approx(len(added) / n)
    tokens = sum(chunk_tokens(index, encoder, c) for c in added)
    assert m.mean_added_tokens == pytest.approx(tokens / n)


def test_coverage_per_question_type(index: Index, encoder: LocalTokenizer) -> None:
    rows = [ResidentSet("case", "planner", RESIDENT, 0, 0, 1)]
    routing = RoutingSettings(margin=0, hedge=0, spread=0)
    report = evaluate_coverage(index, questions(), rows, encoder, source="test", routing=routing)
    by_type = report.results[0].by_type
    assert set(by_type) == {"simple", "detail"}  # 'unknown' has no gold: excluded
    assert by_type["simple"].coverage == pytest.approx(3 / 3)
    assert by_type["detail"].coverage == pytest.approx(2 / 3)
    assert by_type["detail"].misrouted == 1


@pytest.mark.parametrize(
    ("resident", "added_hits", "in_prefix", "retrieved"),
    [
        pytest.param({"log::c1"}, [], True, False, id="one-part-resident"),
        pytest.param({"alarm::c1"}, ["log::c2"], False, True, id="one-part-retrieved"),
        pytest.param({"alarm::c1"}, ["boat::c1"], False, False, id="invisible"),
    ],
)
def test_a_section_is_visible_when_any_of_its_chunks_is(
    index: Index,
    resident: set[str],
    added_hits: list[str],
    in_prefix: bool,
    retrieved: bool,
) -> None:
    gold = frozenset(c.id for c in index.chunks_of("log"))
    routed = RoutedQuestion("p0", "long_tail", None, tuple(added_hits), ())
    tokens = {c.id: 1 for c in index.chunks}
    outcome = question_outcome(routed, resident, [gold], tokens)
    assert (outcome.in_prefix, outcome.retrieved) == (in_prefix, retrieved)
    assert outcome.covered == (in_prefix or retrieved)


def test_unknown_gold_ids_are_counted_and_never_visible(
    index: Index, encoder: LocalTokenizer
) -> None:
    qs = [Question(query="警報が鳴ったら当番は何分以内に連絡する", relevant_ids=("nowhere",))]
    rows = [ResidentSet("rag-top5", "rag", frozenset(), 0, 0, 5)]
    report = evaluate_coverage(index, qs, rows, encoder, source="test")
    assert report.unknown_relevant_count == 1
    assert report.results[0].overall.coverage == 0.0


def test_eval_defaults_are_the_routers() -> None:
    from residency.eval.coverage_options import CoverageOptions
    from residency.serve.settings import ServeSettings

    evaluate = inspect.signature(evaluate_coverage).parameters
    assert evaluate["routing"].default is None  # None: RoutingSettings(), the router's
    serve = ServeSettings.model_fields["routing"].get_default(call_default_factory=True)
    assert CoverageOptions().routing == serve == RoutingSettings()
    assert serve.spread == serve.k > 0  # the top-k sections are shown by default
    # One model: the router's routing and the evaluation's are the same settings.
    assert ServeSettings.model_fields["routing"].annotation is RoutingSettings
    assert CoverageOptions.model_fields["routing"].annotation is RoutingSettings


# --- the CLI -------------------------------------------------------------------------------


def run_coverage_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """`residency eval coverage ARGS`."""
    return run_cli("eval", "coverage", *args, timeout=120)


def make_plan(index: Index, encoder: LocalTokenizer, budget: int) -> ResidencyPlan:
    capacity = CapacitySnapshot(
        model="tiny",
        host="test",
        max_model_len=budget,
        kv_cache_tokens=budget,
        block_size=16,
        is_hybrid=False,
        resident_budget_tokens=budget,
        binding_constraint="max_model_len",
        reasoning="test",
    )
    log = [LogEntry(query=q, count=10 - i) for i, (q, *_) in enumerate(QUESTIONS)]
    mass = log_mass(index, log)
    return build_plan(index, mass, capacity, encoder, PlanOptions(strategy="planner"))


@pytest.fixture(scope="module")
def plan_file(
    index: Index, encoder: LocalTokenizer, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    path = tmp_path_factory.mktemp("plan") / "plan.json"
    # The instructions take ~155 tokens: room for two or three short sections.
    write_plan(make_plan(index, encoder, 250), path)
    return path


def test_cli_evaluates_a_plan_like_the_library(
    index: Index, encoder: LocalTokenizer, corpus: Path, plan_file: Path
) -> None:
    out = run_coverage_cli(
        "--plan", str(plan_file), "--questions", str(corpus / "qa.jsonl"), "--json"
    )
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    plan = ResidencyPlan.model_validate_json(plan_file.read_bytes())
    assert plan.resident  # the plan keeps something resident
    expected = evaluate_coverage(
        index, questions(), [ResidentSet.from_plan(plan, DEFAULT_K)], encoder, source="test"
    )
    assert got["results"][0]["name"] == "planner"
    assert got["results"][0]["overall"] == expected.results[0].overall.model_dump(mode="json")
    assert got["settings"]["tokenizer"] == encoder.name


def test_cli_prints_a_table_for_a_plan(corpus: Path, plan_file: Path) -> None:
    out = run_coverage_cli("--plan", str(plan_file), "--questions", str(corpus / "qa.jsonl"))
    assert out.returncode == 0, out.stderr
    assert "planner" in out.stdout
    assert "coverage" in out.stdout
    assert "By question type" in out.stdout


def test_cli_compares_plans_side_by_side_beside_rag_at_equal_k(
    index: Index, encoder: LocalTokenizer, corpus: Path, plan_file: Path, tmp_path: Path
) -> None:
    bigger = tmp_path / "plan-big.json"
    write_plan(make_plan(index, encoder, 400), bigger)
    qa = str(corpus / "qa.jsonl")
    out = run_coverage_cli(
        "--plan", str(plan_file), "--plan", str(bigger), "--questions", qa, "--k", "3", "--json"
    )
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    rows = {r["name"]: r for r in got["results"]}
    assert list(rows) == ["planner (plan)", "planner (plan-big)", "rag-top3"]
    assert [r["k"] for r in rows.values()] == [3, 3, 3]
    assert rows["planner (plan-big)"]["resident_chunks"] > rows["planner (plan)"]["resident_chunks"]
    rag = ResidentSet("rag-top3", "rag", frozenset(), 0, 0, 3)
    expected = evaluate_coverage(index, questions(), [rag], encoder, source="t").results[0]
    assert rows["rag-top3"]["overall"] == expected.overall.model_dump(mode="json")
    for row in rows.values():
        for m in row["by_type"].values():  # per type: uncached tokens = added + the question
            assert m["mean_uncached_tokens"] > m["mean_added_tokens"]
    table = run_coverage_cli("--plan", str(plan_file), "--plan", str(bigger), "--questions", qa)
    assert "uncached" in table.stdout.split("By question type")[1]


def tiny_squad(path: Path) -> Path:
    paragraphs = [
        {
            "context": f"{SECTIONS[k][0]} [SEP] {SECTIONS[k][1]}",
            "qas": [
                {"id": f"{k}-{i}", "question": q, "answers": [{"text": "x"}]}
                for i, (q, g, *_) in enumerate(QUESTIONS * 2)
                if g == k
            ]
            + [
                {
                    "id": f"{k}-t",
                    "question": f"{SECTIONS[k][0]}とは何か",
                    "answers": [{"text": "x"}],
                }
            ],
        }
        for k in ("alarm", "wind", "battery", "boat", "paint")
    ]
    path.write_text(json.dumps({"data": [{"title": "灯台", "paragraphs": paragraphs}]}), "utf-8")
    return path


def test_cli_simulation_compares_every_strategy_and_reuses_its_index(tmp_path: Path) -> None:
    squad = tiny_squad(tmp_path / "squad.json")
    args = ("--squad", str(squad), "--budget", "260", "--log-size", "200", "--eval-size", "100")
    out = run_coverage_cli(*args, "--cache-dir", str(tmp_path / "cache"), "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    names = [r["name"] for r in report["results"]]
    assert names == ["rag-top3", "rag-top5", "cag", "random", "frequency", "density", "planner"]
    assert {r["overall"]["questions"] for r in report["results"]} == {100}
    assert [r["k"] for r in report["results"]] == [3, 5, 5, 5, 5, 5, 5]
    for r in report["results"]:
        assert r["prefix_tokens"] <= 260
        assert (r["resident_sections"] == 0) == r["name"].startswith("rag")
    assert report["settings"]["embedder"] is None  # BM25-only by default, and it says so
    assert any("BM25-only" in n and "built" in n for n in report["notes"])
    again = run_coverage_cli(*args, "--cache-dir", str(tmp_path / "cache"), "--json")
    assert any("reused" in n for n in json.loads(again.stdout)["notes"])
    assert json.loads(again.stdout)["results"] == report["results"]  # seeded: same run


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        pytest.param(("--budget", "0"), "--budget", id="budget-zero"),
        pytest.param(("--budget", "-5"), "--budget", id="budget-negative"),
        pytest.param(("--log-size", "0"), "--log-size", id="log-size"),
        pytest.param(("--eval-size", "0"), "--eval-size", id="eval-size"),
        pytest.param(("--hedge", "-1"), "--hedge", id="hedge-negative"),
        pytest.param(("--seeds", "0"), "--seeds", id="seeds-zero"),
    ],
)
def test_cli_out_of_bounds_is_one_line_naming_the_flag_and_the_value(
    args: tuple[str, ...], flag: str, tmp_path: Path
) -> None:
    """The field's bounds, checked by bind before anything is read: one line, exit 1."""
    out = run_coverage_cli("--squad", str(tmp_path / "none.json"), *args)
    assert out.returncode == 1, out.stdout + out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"error: {flag}: "), lines
    assert f"got {args[1]}" in lines[0], lines
    assert "allowed: [" in lines[0], lines


def corrupt_plan(plan_file: Path, path: Path, **update: str) -> Path:
    plan = ResidencyPlan.model_validate_json(plan_file.read_bytes())
    write_plan(plan.model_copy(update=update), path)
    return path


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(
            ("--squad", "{tmp}/none.json"), "--squad {tmp}/none.json: no such", id="squad-missing"
        ),
        # A bound typer cannot check (gt=0) is refused by the model, naming the field's flag.
        pytest.param(
            ("--squad", "{squad}", "--zipf", "0"), "greater than 0, got 0.0", id="zipf-zero"
        ),
        pytest.param(
            ("--squad", "{squad}", "--k", "0"),
            "--k 0: eval coverage compares RAG at the router's k; give --k 1 or more",
            id="k-zero",
        ),
        pytest.param(
            ("--squad", "{squad}", "--k", "-1"),
            "--k: input should be greater than or equal to 0, got -1",
            id="k-negative",
        ),
        pytest.param(
            ("--plan", "{tmp}/none.json", "--questions", "{qa}"),
            "--plan {tmp}/none.json",
            id="plan-missing",
        ),
        pytest.param(
            ("--plan", "{plan}", "--questions", "{tmp}/none.jsonl"),
            "--questions",
            id="questions-missing",
        ),
        pytest.param(("--plan", "{plan}"), "needs --questions", id="plan-without-questions"),
        pytest.param(
            ("--plan", "{hash_plan}", "--questions", "{qa}"),
            "made from corpus 000000000000",
            id="corpus-hash",
        ),
        pytest.param(
            ("--plan", "{dir_plan}", "--questions", "{qa}"),
            "not a residency index",
            id="index-gone",
        ),
        pytest.param(
            ("--plan", "{plan}", "--squad", "{squad}"), "pass either --plan", id="both-modes"
        ),
        pytest.param((), "pass either --plan", id="no-mode"),
    ],
)
def test_cli_bad_input_is_one_line_and_exit_1(
    args: tuple[str, ...], message: str, tmp_path: Path, corpus: Path, plan_file: Path
) -> None:
    paths = {
        "tmp": str(tmp_path),
        "qa": str(corpus / "qa.jsonl"),
        "plan": str(plan_file),
        "squad": str(tiny_squad(tmp_path / "squad.json")),
        "hash_plan": str(corrupt_plan(plan_file, tmp_path / "p1.json", corpus_hash="0" * 64)),
        "dir_plan": str(corrupt_plan(plan_file, tmp_path / "p2.json", index_dir=str(tmp_path))),
    }
    out = run_coverage_cli(
        *(a.format(**paths) for a in args), "--cache-dir", str(tmp_path / "cache")
    )
    assert out.returncode == 1, out.stdout + out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("error: ")
    assert message.format(**paths) in lines[0]
    assert "Traceback" not in out.stderr


def test_cli_simulation_models_a_host_with_several_prefixes(tmp_path: Path) -> None:
    squad = tiny_squad(tmp_path / "squad.json")
    # Window 3,692 - 3,392 reserved = 300 tokens; KV 3,392 (one request's blocks) + 900: three
    # prefixes of a window each, against one for single-prefix.
    out = run_coverage_cli(
        "--squad",
        str(squad),
        "--budget",
        "260",
        "--log-size",
        "200",
        "--eval-size",
        "100",
        "--kv-cache-tokens",
        "4292",
        "--max-model-len",
        "3692",
        "--k",
        "4",
        "--cache-dir",
        str(tmp_path / "cache"),
        "--json",
    )
    assert out.returncode == 0, out.stderr
    results = {r["name"]: r for r in json.loads(out.stdout)["results"]}
    assert list(results)[:3] == ["rag-top3", "rag-top4", "rag-top5"]  # RAG at the router's k
    assert list(results)[-2:] == ["single-prefix", "residency"]
    single, served = results["single-prefix"], results["residency"]
    assert single["prefix_tokens"] <= 300
    assert served["resident_sections"] > single["resident_sections"]
    assert served["overall"]["resident_share"] >= single["overall"]["resident_share"]


@pytest.mark.parametrize(
    ("resident", "expected"),
    [
        (frozenset({"a1"}), (True, False)),  # one of two gold sections visible: any, not all
        (frozenset({"a1", "b1"}), (True, True)),
        (frozenset(), (False, False)),
    ],
    ids=["one-of-two", "both", "none"],
)
def test_coverage_all_needs_every_gold_section(
    resident: frozenset[str], expected: tuple[bool, bool]
) -> None:
    routed = RoutedQuestion("p0", "resident", "z1", ("z2",), ())  # nothing gold is added
    outcome = question_outcome(
        routed, resident, [frozenset({"a1"}), frozenset({"b1"})], {"z1": 1, "z2": 1}
    )
    assert (outcome.covered, outcome.all_visible) == expected


def test_cli_simulation_over_several_seeds_reports_mean_and_sd(tmp_path: Path) -> None:
    squad = tiny_squad(tmp_path / "squad.json")
    common = ("--squad", str(squad), "--budget", "260", "--log-size", "200", "--eval-size", "100")
    cache = ("--cache-dir", str(tmp_path / "cache"))
    out = run_coverage_cli(*common, *cache, "--seeds", "2", "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    names = [r["name"] for r in report["results"]]
    assert names.count("random") == 1  # ten draws, one mean row
    assert not any("#" in n for n in names)
    assert any("mean of 10 draws" in n for n in report["notes"])
    rows = {r["name"]: r for r in report["across_seeds"]}
    assert list(rows) == names
    seed1 = json.loads(run_coverage_cli(*common, *cache, "--seed", "1", "--json").stdout)
    for name, row in rows.items():
        assert row["seeds"] == 2
        values = [
            next(r for r in rep["results"] if r["name"] == name)["overall"]["coverage"]
            for rep in (report, seed1)
        ]
        assert row["coverage"]["mean"] == pytest.approx(sum(values) / 2)
        assert row["coverage"]["sd"] == pytest.approx(abs(values[0] - values[1]) / 2**0.5)
        rescued = [
            next(r for r in rep["results"] if r["name"] == name)["rag_misses_rescued"]
            for rep in (report, seed1)
        ]
        present = [x for x in rescued if x is not None]  # None: rag-top5 missed nothing
        if present:
            assert row["rag_misses_rescued"]["mean"] == pytest.approx(sum(present) / len(present))
        else:
            assert row["rag_misses_rescued"] is None
    table = run_coverage_cli(*common, *cache, "--seeds", "2")
    assert "Across 2 traffic seeds" in table.stdout


def test_rescued_share_counts_only_rag_top5_misses() -> None:
    from residency.eval.coverage import StrategyResult, rescued_of_rag, summarize

    def row(name: str, mask: tuple[bool, ...]) -> StrategyResult:
        return StrategyResult(
            name=name,
            strategy="x",
            k=5,
            resident_sections=0,
            resident_chunks=0,
            prefix_tokens=0,
            predicted_resident_share=None,
            overall=summarize([]),
            by_type={},
            covered_mask=mask,
        )

    rows = rescued_of_rag(
        [row("rag-top5", (True, False, False, True)), row("residency", (False, True, False, True))]
    )
    # RAG misses questions 1 and 2; residency covers 1 of them (losing question 0 does not count).
    assert [r.rag_misses_rescued for r in rows] == [0.0, 0.5]
    assert "covered_mask" not in rows[1].model_dump()


def test_prompt_and_uncached_tokens_per_question(index: Index, encoder: LocalTokenizer) -> None:
    """Prompt = the routed prefix + the added chunks + the question; uncached = all but the
    prefix. With two prefixes each question pays only the one it is routed to."""
    one = ResidentSet("one", "planner", RESIDENT, 3, 1000, DEFAULT_K)
    two = ResidentSet(
        "two",
        "planner",
        frozenset({"alarm::c1", "wind::c1", "battery::c1", "boat::c1"}),
        4,
        100,
        DEFAULT_K,
        prefix_chunks=(
            ("p0", frozenset({"alarm::c1", "wind::c1"})),
            ("p1", frozenset({"battery::c1", "boat::c1"})),
        ),
        prefix_token_counts=(100, 200),
    )
    # The first four questions rank their own gold first: alarm, wind (p0), battery, boat (p1).
    four = questions()[:4]
    routing = RoutingSettings(margin=0)
    report = evaluate_coverage(index, four, [one, two], encoder, source="test", routing=routing)
    asked = sum(encoder.count(q.query) for q in four) / len(four)
    for row in report.results:
        m = row.overall
        assert m.mean_uncached_tokens == pytest.approx(m.mean_added_tokens + asked)
    single, double = (r.overall for r in report.results)
    assert single.mean_prompt_tokens == pytest.approx(1000 + single.mean_uncached_tokens)
    paid = double.mean_prompt_tokens - double.mean_uncached_tokens
    assert paid == pytest.approx((2 * 100 + 2 * 200) / 4)


def test_cli_server_and_explicit_host_flags_exclude_each_other(tmp_path: Path) -> None:
    out = run_coverage_cli(
        "--squad",
        str(tiny_squad(tmp_path / "squad.json")),
        "--server",
        "http://127.0.0.1:9",
        "--kv-cache-tokens",
        "4292",
        "--cache-dir",
        str(tmp_path / "cache"),
    )
    assert out.returncode == 1, out.stderr
    assert out.stderr.strip().splitlines() == [
        "error: --server http://127.0.0.1:9 describes the host: drop --kv-cache-tokens and "
        "--max-model-len"
    ]


@pytest.mark.vllm
def test_cli_simulation_models_the_host_of_a_running_server(
    tmp_path: Path, vllm_dense_server: VllmServer
) -> None:
    """--server reads the KV-cache tokens and max_model_len vLLM reports: the same rows as
    passing those two numbers by hand."""
    from residency.vllm_client import VllmClient

    url = vllm_dense_server.base_url
    with VllmClient(url) as client:
        tokens, length = client.kv_cache_tokens(), client.models()[0].max_model_len
    assert tokens is not None
    assert length is not None
    common = (
        "--squad",
        str(tiny_squad(tmp_path / "squad.json")),
        "--budget",
        "260",
        "--log-size",
        "200",
        "--eval-size",
        "100",
        "--cache-dir",
        str(tmp_path / "cache"),
        "--json",
    )
    served = run_coverage_cli(*common, "--server", url)
    by_hand = run_coverage_cli(
        *common, "--kv-cache-tokens", str(tokens), "--max-model-len", str(length)
    )
    assert served.returncode == 0, served.stderr
    assert by_hand.returncode == 0, by_hand.stderr
    rows = json.loads(served.stdout)["results"]
    assert [r["name"] for r in rows][-2:] == ["single-prefix", "residency"]
    assert rows == json.loads(by_hand.stdout)["results"]


def test_cli_tables_keep_every_strategy_name_whole_at_80_columns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    out = run_coverage_cli(
        "--squad",
        str(tiny_squad(tmp_path / "squad.json")),
        "--budget",
        "260",
        "--log-size",
        "200",
        "--eval-size",
        "100",
        "--kv-cache-tokens",
        "4292",
        "--max-model-len",
        "3692",
        "--seeds",
        "2",
        "--cache-dir",
        str(tmp_path / "cache"),
    )
    assert out.returncode == 0, out.stderr
    names = ("rag-top3", "rag-top5", "planner", "single-prefix", "residency")
    for title in ("Coverage", "Routing and prompt tokens", "Across 2 traffic seeds", "Tokens"):
        assert title in out.stdout
    table_lines = [line for line in out.stdout.splitlines() if line.lstrip().startswith(names)]
    assert len(table_lines) >= 4 * len(names), out.stdout  # four tables, every row
    assert all(len(line) <= 80 for line in out.stdout.splitlines()), out.stdout
    assert "…" not in out.stdout, out.stdout


# --- the dated route ------------------------------------------------------------------------

NOTES = {
    "note-mar-04": (
        "2025-03-04",
        "Fog signal at the north light sounded falsely; the horn was reset.",
    ),
    "note-mar-20": ("2025-03-20", "Patrol to the island light: the radio connector was replaced."),
    "note-may-02": ("2025-05-02", "Lens cleaning at the harbour light, glass wiped twice."),
    "manual-radio": (None, "The radio is checked every morning; a replaced connector is logged."),
    "manual-fog": (None, "The fog signal sounds twice a minute when visibility is low."),
}
IN_MARCH = Question(
    query="What did the fog signal and radio need in March 2025?",
    relevant_ids=("note-mar-04", "note-mar-20"),
    type="timeline",
)


@pytest.fixture(scope="module")
def dated_index(tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: Path) -> Index:
    root = tmp_path_factory.mktemp("dated")
    (root / "docs").mkdir()
    records = [
        orjson.dumps({"id": k, "title": k, "text": text} | ({"date": day} if day else {}))
        for k, (day, text) in NOTES.items()
    ]
    (root / "docs" / "notes.jsonl").write_bytes(b"\n".join(records) + b"\n")
    build_index(
        root / "docs", root / "index", IndexOptions(dense=False), LocalTokenizer(tokenizer_dir)
    )
    return open_index(root / "index")


def test_the_dated_route_pins_the_period_s_sections_as_the_router_does(
    dated_index: Index, encoder: LocalTokenizer
) -> None:
    ranked = [h.id for h in dated_index.search_chunks(IN_MARCH.query, 5)]
    assert ranked[:4] == [
        "manual-fog::c1",
        "note-mar-04::c1",
        "manual-radio::c1",
        "note-mar-20::c1",
    ]
    served = ResidentSet("served", "planner", frozenset({"note-mar-04::c1"}), 1, 0, 1)
    rag = ResidentSet("rag-top1", "rag", frozenset(), 0, 0, 1)
    rows = [served, rag]
    undated = RoutingSettings(margin=0, hops=1, spread=0, max_dated=0)
    plain = evaluate_coverage(dated_index, [IN_MARCH], rows, encoder, source="t", routing=undated)
    routing = undated.model_copy(update={"today": dt.date(2025, 6, 15), "max_dated": 5})
    dated = evaluate_coverage(dated_index, [IN_MARCH], rows, encoder, source="t", routing=routing)
    # Top-1 retrieval adds manual-fog and misses note-mar-20; the dated route pins note-mar-20
    # whole (note-mar-04 is wholly in the prefix: not repeated); plain RAG pins nothing.
    assert [r.overall.coverage_all for r in plain.results] == [0.0, 0.0]
    assert [r.overall.coverage_all for r in dated.results] == [1.0, 0.0]
    assert dated.results[0].overall.mean_added_chunks == 2  # manual-fog + note-mar-20
    note = dated_index.section("note-mar-20")
    section = render_passage(note, note.text)  # pinned whole, with its source, as the router does
    extra = dated.results[0].overall.mean_added_tokens - plain.results[0].overall.mean_added_tokens
    assert extra == encoder.count(section) + 1
    assert dated.results[1].overall == plain.results[1].overall
    assert (dated.settings.today, dated.settings.max_dated) == (dt.date(2025, 6, 15), 5)
    assert (plain.settings.today, plain.settings.max_dated) == (None, 0)
    # Another year: no section is dated inside it, nothing is pinned.
    other_year = IN_MARCH.model_copy(update={"query": IN_MARCH.query.replace("2025", "2024")})
    later = evaluate_coverage(
        dated_index, [other_year], [served], encoder, source="t", routing=routing
    )
    assert later.results[0].overall.coverage_all == 0.0


@pytest.mark.parametrize("max_dated", [1, 2, 5])
def test_eval_and_router_pin_the_same_dated_sections(
    dated_index: Index, encoder: LocalTokenizer, tmp_path: Path, max_dated: int
) -> None:
    from residency.context.builder import ContextBuilder
    from residency.context.settings import ContextSettings
    from residency.eval.dated import dated_pinning

    today = dt.date(2025, 6, 15)
    capacity = CapacitySnapshot(
        model="tiny",
        host="test",
        max_model_len=230,
        kv_cache_tokens=230,
        block_size=16,
        is_hybrid=False,
        resident_budget_tokens=230,
        binding_constraint="max_model_len",
        reasoning="test",
    )
    log = [LogEntry(query="fog signal sounded falsely horn reset", count=9)]
    plan = build_plan(dated_index, log_mass(dated_index, log), capacity, encoder, PlanOptions())
    assert "note-mar-04::c1" in plan.resident_chunk_ids()  # one dated note is resident
    path = tmp_path / "plan.json"
    write_plan(plan, path)
    settings = ContextSettings(
        retriever="bm25", routing=RoutingSettings(today=today, max_dated=max_dated)
    )
    builder = ContextBuilder(plan, dated_index, settings)
    pinning = dated_pinning(dated_index, encoder, today, max_dated)
    assert pinning is not None
    queries = [
        IN_MARCH.query,
        "What happened at the lights in 2025?",
        "Which light had its lens cleaned in May 2025?",
        "What was done last month?",
        "How often does the fog signal sound?",
    ]
    resident = plan.resident_chunk_ids()
    pinned_any = 0
    for query, hits in rank_queries(dated_index, queries, 40).items():
        routed = builder.retrieve(query, today)
        pinned = pinning.sections(query, hits, resident)
        assert pinned == routed.dated_section_ids, query
        rendered = builder.render(routed, ()).passages  # what the router puts in the prompt
        assert len(rendered) == len(routed.dated_section_ids)
        assert pinning.tokens(pinned) == sum(encoder.count(r) + 1 for r in rendered), query
        pinned_any += bool(pinned)
    assert pinned_any >= 2  # the check is not vacuous


def test_the_cli_dated_route_defaults_are_the_routers() -> None:
    from residency.eval.coverage_options import CoverageOptions
    from residency.serve.settings import ServeSettings

    routing = CoverageOptions().routing
    assert routing == ServeSettings(plan=Path("p.json")).routing
    assert routing.max_dated > 0


def test_cli_refuses_a_bad_today_in_one_line(tmp_path: Path) -> None:
    out = run_coverage_cli("--squad", str(tmp_path / "none.json"), "--today", "2026-13-01")
    assert out.returncode != 0
    assert out.stderr.strip().splitlines() == [
        "error: --today '2026-13-01': expected YYYY-MM-DD, e.g. 2026-01-15"
    ]
