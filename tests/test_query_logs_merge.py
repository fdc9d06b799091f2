"""Many routers, one plan: several query logs (files and globs) merged by timestamp."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest
from residency_cli import run_cli

from residency.errors import ConfigError
from residency.index import IndexOptions, build_index
from residency.planning.plan_model import read_plan
from residency.query_log import expand_log_patterns, merge_by_time, read_query_log
from residency.tokenizer import ApproxTokenizer

UTC = dt.UTC


def write_log(path: Path, lines: list[dict[str, object] | str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = [x if isinstance(x, str) else json.dumps(x, ensure_ascii=False) for x in lines]
    path.write_text("\n".join(text) + "\n", encoding="utf-8")
    return path


def test_globs_and_files_expand_in_order_each_file_once(tmp_path: Path) -> None:
    a = write_log(tmp_path / "logs/router-a.jsonl", [{"query": "q"}])
    b = write_log(tmp_path / "logs/router-b.jsonl", [{"query": "q"}])
    write_log(tmp_path / "logs/other.txt", [{"query": "q"}])
    got = expand_log_patterns([str(b), str(tmp_path / "logs/router-*.jsonl")])
    assert got == [b, a]  # b as given first, then the glob's new match; b not twice


@pytest.mark.parametrize(
    ("pattern", "message"),
    [
        pytest.param("missing.jsonl", "no such file", id="literal-missing"),
        pytest.param("logs/*.jsonl", "matches no file", id="glob-matches-nothing"),
    ],
)
def test_a_log_that_is_not_there_is_refused(tmp_path: Path, pattern: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        expand_log_patterns([str(tmp_path / pattern)])


def test_entries_merge_by_timestamp_across_logs(tmp_path: Path) -> None:
    a = write_log(
        tmp_path / "a.jsonl",
        [
            {"query": "a1", "ts": "2025-01-01T10:00:00+00:00"},
            {"query": "a-undated"},
            {"query": "a2", "ts": "2025-01-01T12:00:00+00:00"},
            "{torn line",
        ],
    )
    b = write_log(
        tmp_path / "b.jsonl",
        [
            {"query": "b1", "ts": "2025-01-01T11:00:00+00:00"},
            {"query": "b2", "ts": "2025-01-01T20:30:00+09:00"},  # 11:30 UTC
            {"query": "b-naive", "ts": "2025-01-01T10:30:00"},  # naive: read as UTC
        ],
    )
    merged = merge_by_time([read_query_log(a), read_query_log(b)])
    assert [e.query for e in merged.entries] == ["a1", "b-naive", "b1", "b2", "a2", "a-undated"]
    assert merged.skipped == (f"{a}:4: not valid JSON",)
    assert merged.total_count == 6


def test_plan_from_two_routers_logs_records_each_file(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "manual.md").write_text(
        "# 手引き {#top}\n\n## 霧笛 {#fog}\n\n霧笛は視程が一海里を下回ると鳴る。\n\n"
        "## 蓄電池 {#battery}\n\n蓄電池は五年ごとに交換する。\n",
        encoding="utf-8",
    )
    build_index(docs, tmp_path / "index", IndexOptions(dense=False), ApproxTokenizer())
    stamp = dt.datetime(2025, 1, 1, tzinfo=UTC)
    for replica, (query, n) in {"a": ("霧笛はいつ鳴る？", 3), "b": ("蓄電池の交換は？", 2)}.items():
        write_log(
            tmp_path / f"logs/router-{replica}.jsonl",
            [
                {"query": query, "ts": (stamp + dt.timedelta(minutes=i)).isoformat()}
                for i in range(n)
            ],
        )
    out = run_cli(
        "plan",
        "--index",
        str(tmp_path / "index"),
        "--log",
        str(tmp_path / "logs/router-*.jsonl"),
        "-o",
        str(tmp_path / "plan.json"),
    )
    assert out.returncode == 0, out.stderr
    assert "from 2 logs (router-a.jsonl 3 lines, router-b.jsonl 2 lines)" in out.stdout
    log = read_plan(tmp_path / "plan.json").log
    assert (log.entries, log.total_count) == (5, 5)
    assert [(Path(f.path).name, f.entries) for f in log.files] == [
        ("router-a.jsonl", 3),
        ("router-b.jsonl", 2),
    ]
    assert log.files[0].first_ts == stamp
    assert log.files[0].last_ts == stamp + dt.timedelta(minutes=2)
