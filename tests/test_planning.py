"""Residency planning on a real (BM25-only) index of a small hand-made corpus."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from residency_cli import run_cli
from section_index import docs_index

from planner import InfeasiblePlanError
from residency.errors import ConfigError
from residency.index import Index
from residency.planning.build import PlanOptions, build_plan, log_mass
from residency.planning.plan_model import CapacitySnapshot, read_plan, write_plan
from residency.planning.prefix import hash_token_ids
from residency.query_log import LogEntry, read_query_log
from residency.tokenizer import LocalTokenizer

TOPICS = {
    "alarm": "警報が鳴ったら当番は十五分以内に監視室へ連絡し、主灯の状態を確認する。",
    "wind": "風速十五メートルを超えたら屋外作業を中止し、雷鳴から三十分は再開しない。",
    "battery": "蓄電池は五年ごとに交換し、交換後は電圧を記録簿に書く。",
    "boat": "作業船は波高一メートル以下でのみ出航し、救命胴衣を必ず着用する。",
    "paint": "灯塔の塗装は十年ごとに行い、色は白と赤の二色とする。",
}


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: Path) -> Index:
    body = "\n\n".join(f"## {name} {{#{name}}}\n\n{text * 3}" for name, text in TOPICS.items())
    long_text = "".join(f"第{i}項。保守記録の詳細な手順をここに書く。" for i in range(300))
    files = {
        "manual.md": f"# マニュアル {{#top}}\n\n概要。\n\n{body}\n",
        "long.md": f"# 長い手順 {{#long}}\n\n{long_text}\n",
    }
    return docs_index(tmp_path_factory.mktemp("planning"), files, tokenizer_dir)


def capacity(budget: int, *, hybrid: bool = False, block: int = 16) -> CapacitySnapshot:
    return CapacitySnapshot(
        model="tiny",
        host="test",
        max_model_len=32768,
        kv_cache_tokens=10**6,
        block_size=block,
        is_hybrid=hybrid,
        resident_budget_tokens=budget,
        binding_constraint="max_model_len",
        reasoning="test",
    )


LOG = [
    LogEntry(query="警報が鳴ったらどうする", count=40),
    LogEntry(query="風速何メートルで作業中止", count=25),
    LogEntry(query="蓄電池の交換周期", count=2),
]


def test_attribution_follows_the_log(index: Index) -> None:
    mass = log_mass(index, LOG)
    assert max(mass, key=lambda sid: mass[sid]) == "manual#alarm"
    assert mass["manual#alarm"] > mass["manual#wind"] > mass.get("manual#paint", 0.0)
    assert sum(mass.values()) == pytest.approx(67)  # every count is attributed once


def test_planner_prefers_asked_sections_and_renders_them_exactly(
    index: Index, tokenizer_dir: Path
) -> None:
    encoder = LocalTokenizer(tokenizer_dir)
    plan = build_plan(index, log_mass(index, LOG), capacity(700), encoder, PlanOptions())
    ids = [r.section_id for r in plan.resident]
    assert "manual#alarm" in ids
    assert "manual#wind" in ids
    assert plan.prefix.token_count <= 700
    assert plan.prefix.token_count == len(encoder.encode(plan.prefix.text) or [])
    assert plan.prefix.hash == hash_token_ids(encoder.encode(plan.prefix.text) or [])
    assert TOPICS["alarm"] in plan.prefix.text
    assert "[id: manual#alarm]" in plan.prefix.text
    assert set(plan.long_tail_section_ids).isdisjoint(
        {r.section_id for r in plan.resident if "::part" not in r.id}
    )


def test_hybrid_prefix_ends_on_a_block_boundary(index: Index, tokenizer_dir: Path) -> None:
    plan = build_plan(
        index,
        log_mass(index, LOG),
        capacity(1024, hybrid=True, block=128),
        LocalTokenizer(tokenizer_dir),
        PlanOptions(),
    )
    assert plan.prefix.aligned_to == 128
    assert plan.prefix.token_count % 128 == 0
    assert plan.prefix.token_count <= 1024


def test_sections_larger_than_the_budget_are_split_at_chunk_boundaries(
    index: Index, tokenizer_dir: Path
) -> None:
    mass = {"long#long": 100.0}
    plan = build_plan(index, mass, capacity(900), LocalTokenizer(tokenizer_dir), PlanOptions())
    parts = [r for r in plan.resident if r.section_id == "long#long"]
    assert parts
    assert all("::part" in r.id for r in parts)
    chunk_ids = {c.id for c in index.chunks_of("long#long")}
    assert all(set(r.chunk_ids) <= chunk_ids for r in parts)
    assert "long#long" in plan.long_tail_section_ids  # not wholly resident


def test_pins_and_excludes(index: Index, tokenizer_dir: Path) -> None:
    plan = build_plan(
        index,
        log_mass(index, LOG),
        capacity(700),
        LocalTokenizer(tokenizer_dir),
        PlanOptions(pins=("manual#paint",), excludes=("manual#alarm",)),
    )
    ids = [r.section_id for r in plan.resident]
    assert ids[0] == "manual#paint"  # pinned first
    assert "manual#alarm" not in ids


@pytest.mark.parametrize(
    ("options", "error", "fragment"),
    [
        pytest.param(PlanOptions(pins=("nope#x",)), ConfigError, "nope#x", id="unknown-pin"),
        pytest.param(
            PlanOptions(excludes=("nah",)), ConfigError, "--exclude", id="unknown-exclude"
        ),
        pytest.param(
            PlanOptions(pins=("long#long",)), InfeasiblePlanError, "--pin", id="pins-over-budget"
        ),
    ],
)
def test_bad_plans_are_refused(
    index: Index, tokenizer_dir: Path, options: PlanOptions, error: type[Exception], fragment: str
) -> None:
    with pytest.raises(error, match=fragment.replace("#", "\\#")):
        build_plan(index, {}, capacity(600), LocalTokenizer(tokenizer_dir), options)


@pytest.mark.parametrize("strategy", ["planner", "frequency", "density", "random", "cag", "rag"])
def test_every_strategy_fits_the_budget(index: Index, tokenizer_dir: Path, strategy: str) -> None:
    plan = build_plan(
        index,
        log_mass(index, LOG),
        capacity(800),
        LocalTokenizer(tokenizer_dir),
        PlanOptions(strategy=strategy),  # type: ignore[arg-type]
    )
    assert plan.prefix.token_count <= 800
    assert (len(plan.resident) == 0) == (strategy == "rag")


def test_plan_json_round_trips(index: Index, tokenizer_dir: Path, tmp_path: Path) -> None:
    plan = build_plan(index, {}, capacity(700), LocalTokenizer(tokenizer_dir), PlanOptions())
    path = tmp_path / "plan.json"
    write_plan(plan, path)
    assert read_plan(path) == plan
    assert [p.name for p in tmp_path.iterdir()] == ["plan.json"]  # no temp file left


def test_query_log_skips_bad_lines_with_their_numbers(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    path.write_text('{"query": "a", "count": 2}\n{"count": 1}\nnot json\n{"query": "b"', "utf-8")
    log = read_query_log(path)
    assert [e.query for e in log.entries] == ["a"]
    assert log.total_count == 2
    assert [s.split(": ")[0] for s in log.skipped] == [f"{path}:2", f"{path}:3", f"{path}:4"]


def test_cli_plan_writes_plan_json(index: Index, tokenizer_dir: Path, tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    log.write_text("\n".join(json.dumps(e.model_dump(mode="json")) for e in LOG), "utf-8")
    out = tmp_path / "plan.json"
    result = run_cli(
        "plan",
        "--index",
        str(index.directory),
        "--log",
        str(log),
        "--tokenizer-dir",
        str(tokenizer_dir),
        "-o",
        str(out),
        "--json",
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    body = json.loads(result.stdout)
    assert body["resident_budget_tokens"] == 29040
    assert body["plan"]["log"]["total_count"] == 67
    plan = read_plan(out)
    assert plan.prefix.aligned_to == 528  # Qwen3.5-4B default host: hybrid
    assert plan.resident[0].section_id in {s.id for s in index.sections}


def test_cli_plan_unknown_pin_is_one_line(index: Index, tmp_path: Path) -> None:
    result = run_cli(
        "plan",
        "--index",
        str(index.directory),
        "--pin",
        "faq#missing",
        "-o",
        str(tmp_path / "p.json"),
        timeout=120,
    )
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert "faq#missing" in result.stderr
    assert not (tmp_path / "p.json").exists()
