"""The recall canary (residency/serve/canary.py) in a real router with no model server: the
English sample's labelled questions through the live BM25 retriever, then a plan swapped in
whose index is broken (its BM25 rows point at the wrong chunks, as BM25 files of another build
would): `residency_recall_ok` flips to 0 on the change itself, with the canary's schedule far
off (so within one period), and a good index flips it back."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import shutil
import signal
import time
from pathlib import Path
from typing import cast

import httpx
import orjson
import pytest
from offline_router import wait_for
from prometheus_client import CollectorRegistry
from pydantic import ValidationError
from residency_cli import run_cli
from router_server import RouterProcess

from residency.context.builder import ContextBuilder
from residency.context.settings import ContextSettings
from residency.corpus.samples import EN_SAMPLE
from residency.errors import ConfigError
from residency.index import IndexOptions, build_index, open_index
from residency.keep.agent_metrics import AgentMetrics
from residency.planning.plan_model import read_plan
from residency.serve.agent_settings import AgentSettings, floor_of
from residency.serve.canary import MAX_CANARY_BYTES, RecallCanary, evaluate_canary, read_canary
from residency.serve.state import ServingState
from residency.tokenizer import LocalTokenizer
from residency.vllm_client import find_samples, parse_prometheus

PERIOD_S = 3600  # the schedule never fires during the test: only changes trigger runs


@pytest.fixture(scope="module")
def indexes(tmp_path_factory: pytest.TempPathFactory, tiny_tokenizer_dir: Path) -> dict[str, Path]:
    """good and broken (BM25 row ids shuffled) copies of the English sample's index, and a plan
    for each (the same corpus, so the broken one is accepted)."""
    root = tmp_path_factory.mktemp("canary")
    good = root / "good"
    build_index(
        EN_SAMPLE.docs, good, IndexOptions(dense=False), LocalTokenizer(tiny_tokenizer_dir), None
    )
    broken = root / "broken"
    shutil.copytree(good, broken)
    meta_path = next(broken.rglob("bm25.meta.json"))
    meta = orjson.loads(meta_path.read_bytes())
    random.Random(7).shuffle(meta["ids"])
    meta_path.write_bytes(orjson.dumps(meta))
    out = {"good": good, "broken": broken, "plan-good": root / "plan-good.json"}
    done = run_cli(
        "plan", "--index", str(good), "--max-model-len", "8192", "-o", str(out["plan-good"])
    )
    assert done.returncode == 0, done.stderr
    data = orjson.loads(out["plan-good"].read_bytes())
    out["plan-broken"] = root / "plan-broken.json"
    out["plan-broken"].write_bytes(orjson.dumps({**data, "index_dir": str(broken)}))
    return out


def test_the_canary_measures_the_live_retriever_and_sees_a_broken_index(
    indexes: dict[str, Path],
) -> None:
    questions = read_canary(EN_SAMPLE.questions)
    assert len(questions) == 65  # 78 lines, 13 without gold ids
    results = {}
    for name in ("good", "broken"):
        plan = read_plan(indexes[f"plan-{name}"])
        builder = ContextBuilder(plan, open_index(indexes[name]), ContextSettings(retriever="bm25"))
        results[name] = evaluate_canary(builder, questions).metrics
    assert results["good"]["recall_at_10"] >= 0.6
    assert results["broken"]["recall_at_10"] < results["good"]["recall_at_10"] / 2


def test_min_recall_and_the_labelled_set_are_checked(tmp_path: Path) -> None:
    assert floor_of("R@10=0.80") == ("recall_at_10", 0.8)
    assert floor_of("mrr@10=0.5") == ("mrr_at_10", 0.5)
    for bad in ("R@7=0.8", "R@10=1.5", "recall=0.8"):
        with pytest.raises(ValidationError, match="--min-recall"):
            AgentSettings(min_recall=bad)
    empty = tmp_path / "none.jsonl"
    empty.write_text('{"query": "q", "relevant_ids": []}\n')
    with pytest.raises(ConfigError, match="no question with relevant_ids"):
        read_canary(empty)
    torn = tmp_path / "torn.jsonl"
    torn.write_text('{"query": "q", "relevant_ids": ["a"]}\n{"query": \n')
    with pytest.raises(ConfigError, match=r"torn.jsonl:2"):
        read_canary(torn)


def sample(router: RouterProcess, name: str, **labels: str) -> float | None:
    text = httpx.get(f"{router.base_url}/metrics", timeout=30).text
    found = [s for s in find_samples(parse_prometheus(text), name) if s.labels == labels]
    return found[0].value if found else None


def test_recall_ok_flips_on_a_broken_index_within_one_period_and_back(
    indexes: dict[str, Path], dead_upstream: str, tmp_path: Path
) -> None:
    plan = tmp_path / "plan.json"
    plan.write_bytes(indexes["plan-good"].read_bytes())
    args = (
        "--no-warm",
        "--retriever",
        "bm25",
        "--canary",
        str(EN_SAMPLE.questions),
        "--canary-every",
        str(PERIOD_S),
        "--min-recall",
        "R@10=0.60",
    )
    with RouterProcess(plan, [dead_upstream], tmp_path, args).start(require_healthy=False) as r:
        wait_for(lambda: sample(r, "residency_recall_ok") == 1, "the first canary run, above")
        assert sample(r, "residency_recall_set_questions") == 65
        assert sample(r, "residency_recall_floor") == 0.6
        good = sample(r, "residency_recall_at_k", k="10")
        assert good is not None
        assert good >= 0.6
        age = sample(r, "residency_recall_set_age_seconds")
        assert age is not None
        assert age > 0

        plan.write_bytes(indexes["plan-broken"].read_bytes())
        flipped_after = time.monotonic()
        os.kill(r.pid or 0, signal.SIGHUP)
        wait_for(lambda: sample(r, "residency_recall_ok") == 0, "recall_ok to flip to 0")
        flip_s = time.monotonic() - flipped_after
        assert sample(r, "residency_recall_canary_runs_total", trigger="plan") == 1
        assert sample(r, "residency_recall_canary_runs_total", trigger="schedule") in (None, 0)
        broken = sample(r, "residency_recall_at_k", k="10")
        assert broken is not None
        assert broken < 0.6
        warned = [x for x in r.log_text().splitlines() if "BELOW --min-recall" in x]
        assert len(warned) == 1
        assert "recall canary (plan)" in warned[0]

        plan.write_bytes(indexes["plan-good"].read_bytes())
        os.kill(r.pid or 0, signal.SIGHUP)
        wait_for(lambda: sample(r, "residency_recall_ok") == 1, "recall_ok back to 1")
    print(
        f"\nrecall canary: R@10 {good:.3f} -> {broken:.3f}; recall_ok 0 {flip_s:.1f} s after "
        f"SIGHUP (period {PERIOD_S} s)"
    )


def test_a_huge_labelled_set_is_refused_by_its_size_in_one_line(tmp_path: Path) -> None:
    huge = tmp_path / "huge.jsonl"
    with huge.open("wb") as f:
        f.truncate(MAX_CANARY_BYTES + 1)  # sparse: the size is what is judged, unread
    with pytest.raises(ConfigError) as caught:
        read_canary(huge)
    assert str(caught.value) == (
        f"--canary {huge}: {MAX_CANARY_BYTES + 1} bytes, over the {MAX_CANARY_BYTES}-byte "
        "limit of a labelled set; keep a sample of the questions in it"
    )


@pytest.mark.parametrize("damage", ["torn", "not-utf8", "deleted"])
def test_an_unreadable_set_is_retried_with_back_off_and_reported_once(
    tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "qa.jsonl"
    if damage == "torn":
        path.write_bytes(b'{"query": "q", "relevant_ids": ["a"]}\n{"query": ')
    elif damage == "not-utf8":
        path.write_bytes(b'{"query": "\xff\xfe", "relevant_ids": ["a"]}\n')
    settings = AgentSettings(canary=path, canary_every_s=4)
    metrics = AgentMetrics(CollectorRegistry())
    state = cast(ServingState, object())  # never evaluated: no question is ever read
    canary = RecallCanary(settings, metrics, lambda: state)

    async def run_for(seconds: float) -> None:
        task = asyncio.create_task(canary.run())
        await asyncio.sleep(seconds)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    with caplog.at_level(logging.INFO, logger="residency.serve"):
        asyncio.run(run_for(4.2))
    failed = metrics.canary_runs.labels("failed")._value.get()
    # tries at 0, 1, 3 s (back-off 1, 2, then 4 = the period); every 0.5 s before: 9
    assert 2 <= failed <= 3, failed
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, [r.getMessage() for r in errors]
    assert "labelled set unreadable" in errors[0].getMessage()
    assert canary.ok is False
