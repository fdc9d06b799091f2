"""Re-planning from the query log (residency/serve/replan.py), replayed on the English sample
without a model server: a log whose topic mix shifts halfway (questions on the manual, then
questions on the maintenance notes). The plan made from the first half keeps its coverage on
it; after the shift a re-plan covers the second half as well as a plan made by hand from it
(`residency plan --log second-half`), and a real router swaps it in on its own; a stationary
log never swaps."""

from __future__ import annotations

import datetime as dt
import hashlib
import random
from pathlib import Path

import httpx
import orjson
import pytest
from offline_router import wait_for
from residency_cli import run_cli
from router_server import RouterProcess

from residency.corpus.samples import EN_SAMPLE
from residency.index import Index, IndexOptions, build_index, open_index
from residency.planning.plan_model import ResidencyPlan, read_plan
from residency.query_log import LogRead, read_query_log
from residency.serve.replan import Judgement, encoder_of, read_window, replan, window_coverage
from residency.tokenizer import LocalTokenizer
from residency.vllm_client import find_samples, parse_prometheus

WINDOW = 64
WINDOW_FLAG = ("--max-model-len", "8192", "--prefixes", "1")  # holds one topic, not both
CLOSE = 0.01


def topic(name: str) -> list[str]:
    """The sample's questions whose gold sections all lie in the manual, or all in notes."""
    out = []
    for line in EN_SAMPLE.questions.read_bytes().splitlines():
        q = orjson.loads(line)
        ids = q["relevant_ids"]
        if ids and all(i.startswith(name) for i in ids):
            out.append(str(q["query"]))
    return out


def log_lines(questions: list[str], n: int, start: dt.datetime) -> bytes:
    """`n` query-log lines cycling through `questions`, one a minute from `start`."""
    lines = [
        orjson.dumps(
            {
                "query": questions[i % len(questions)],
                "ts": (start + dt.timedelta(minutes=i)).isoformat(),
            }
        )
        for i in range(n)
    ]
    return b"\n".join(lines) + b"\n"


@pytest.fixture(scope="module")
def shift(tmp_path_factory: pytest.TempPathFactory, tiny_tokenizer_dir: Path) -> dict[str, Path]:
    """index; first.jsonl (manual questions), second.jsonl (notes questions); plan-first.json
    and plan-second.json made by hand from each half."""
    root = tmp_path_factory.mktemp("replan")
    build_index(
        EN_SAMPLE.docs,
        root / "index",
        IndexOptions(dense=False),
        LocalTokenizer(tiny_tokenizer_dir),
        None,
    )
    t0 = dt.datetime(2026, 1, 5, 9, tzinfo=dt.UTC)
    out = {"index": root / "index", "first": root / "first.jsonl", "second": root / "second.jsonl"}
    out["first"].write_bytes(log_lines(topic("manual"), WINDOW, t0))
    out["second"].write_bytes(log_lines(topic("note-"), WINDOW, t0 + dt.timedelta(days=1)))
    for half in ("first", "second"):
        out[f"plan-{half}"] = root / f"plan-{half}.json"
        done = run_cli(
            "plan",
            "--index",
            str(out["index"]),
            "--log",
            str(out[half]),
            *WINDOW_FLAG,
            "-o",
            str(out[f"plan-{half}"]),
        )
        assert done.returncode == 0, done.stderr
    return out


def judge(plan: ResidencyPlan, index: Index, window: LogRead, log: Path) -> Judgement:
    """The router's re-plan, through BM25 (the index has no dense vectors)."""
    return replan(plan, index, "bm25", encoder_of(plan, None), window, log)


def test_a_replan_after_the_shift_covers_as_a_hand_plan_and_a_stationary_one_gains_nothing(
    shift: dict[str, Path],
) -> None:
    served = read_plan(shift["plan-first"])
    index = open_index(shift["index"])
    first = read_window(shift["first"], WINDOW)
    second = read_window(shift["second"], WINDOW)

    stationary = judge(served, index, first, shift["first"])
    assert stationary.current >= 0.5  # the plan covers the questions it was made from
    assert stationary.gain <= 0.02, stationary  # nothing to gain: no swap

    shifted = judge(served, index, second, shift["second"])
    hand = window_coverage(read_plan(shift["plan-second"]), index, "bm25", second.entries)
    assert shifted.current < hand - 0.1  # the shift: last month's plan misses this month
    print(
        f"\nstationary {stationary.current:.3f} -> {stationary.candidate:.3f}; after the shift "
        f"{shifted.current:.3f} -> {shifted.candidate:.3f}, hand plan {hand:.3f}"
    )
    assert abs(shifted.candidate - hand) <= CLOSE, (shifted, hand)
    assert shifted.gain > 0.1


def replans(router: RouterProcess, decision: str) -> float:
    text = httpx.get(f"{router.base_url}/metrics", timeout=30).text
    found = find_samples(parse_prometheus(text), "residency_router_replans_total")
    return sum(s.value for s in found if s.labels == {"decision": decision})


def gauge(router: RouterProcess, name: str, **labels: str) -> float:
    text = httpx.get(f"{router.base_url}/metrics", timeout=30).text
    found = [s for s in find_samples(parse_prometheus(text), name) if s.labels == labels]
    return found[0].value


def served_sha(router: RouterProcess) -> str:
    return str(httpx.get(f"{router.base_url}/health", timeout=10).json()["plan_sha256"])


def test_a_router_swaps_in_the_replan_after_the_shift_and_not_before(
    shift: dict[str, Path], dead_upstream: str, tmp_path: Path
) -> None:
    plan = tmp_path / "plan.json"
    plan.write_bytes(shift["plan-first"].read_bytes())
    first_sha = hashlib.sha256(plan.read_bytes()).hexdigest()
    args = (
        "--no-warm",
        "--retriever",
        "bm25",
        "--replan-every",
        "0.5",
        "--replan-window",
        str(WINDOW),
    )
    router = RouterProcess(plan, [dead_upstream], tmp_path, args)
    router.query_log.write_bytes(shift["first"].read_bytes())  # the traffic so far
    with router.start(require_healthy=False):
        wait_for(lambda: replans(router, "keep") >= 3, "three re-plans on the stationary log")
        assert replans(router, "swap") == 0
        assert served_sha(router) == first_sha
        with router.query_log.open("ab") as f:  # the topic mix shifts: a window of new questions
            f.write(shift["second"].read_bytes())
        wait_for(lambda: replans(router, "swap") == 1, "the swap after the shift")
        new_sha = served_sha(router)
        assert new_sha != first_sha
        assert hashlib.sha256(plan.read_bytes()).hexdigest() == new_sha  # kept across restarts
        keeps = replans(router, "keep")
        wait_for(lambda: replans(router, "keep") >= keeps + 2, "re-plans after the swap")
        assert replans(router, "swap") == 1  # the new plan is what the window asks for
        assert gauge(router, "residency_router_replan_coverage", plan="current") >= 0.5
        decisions = [x for x in router.log_text().splitlines() if "re-plan over the last" in x]
    swap = next(x for x in decisions if x.endswith("swapping it in"))
    assert f"plan {first_sha[:12]} covers" in swap
    index = open_index(shift["index"])
    window = read_query_log(shift["second"]).entries
    served = window_coverage(read_plan(plan), index, "bm25", window)
    hand = window_coverage(read_plan(shift["plan-second"]), index, "bm25", window)
    assert abs(served - hand) <= CLOSE, (served, hand)


def sourced_lines(questions: list[str], n: int, sources: int, **fields: object) -> bytes:
    """`n` router-style lines cycling through `questions`, from `sources` client addresses."""
    lines = [
        orjson.dumps(
            {
                "query": questions[i % len(questions)],
                "source": f"addr:{i % sources}",
                "outcome": "ok",
                **fields,
            }
        )
        for i in range(n)
    ]
    return b"\n".join(lines) + b"\n"


def random_questions(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    return [
        " ".join("".join(rng.choices(letters, k=rng.randint(3, 9))) for _ in range(6))
        for _ in range(n)
    ]


def test_one_client_cannot_steer_a_replan_and_refused_requests_are_no_questions(
    shift: dict[str, Path], tmp_path: Path
) -> None:
    served = read_plan(shift["plan-first"])
    index = open_index(shift["index"])
    log = tmp_path / "queries.jsonl"
    # The attack, 600 random questions from one client, aimed here at the other topic
    # (a notes question and random words: each distinct, all retrieving notes), and 600
    # requests vLLM refused.
    noise = random_questions(600, seed=1)
    notes = topic("note-")
    junk = [f"{notes[i % len(notes)]} {noise[i]}" for i in range(600)]
    with log.open("wb") as f:
        f.write(sourced_lines(topic("manual"), 300, sources=30))
        for q in junk:
            f.write(orjson.dumps({"query": q, "source": "addr:evil", "outcome": "ok"}) + b"\n")
        for i, q in enumerate(random_questions(600, seed=2)):
            line = {"query": q, "source": f"addr:r{i}", "outcome": "client_error"}
            f.write(orjson.dumps(line) + b"\n")
    window = read_window(log, WINDOW, source_share=0.1)
    assert len(window.entries) == WINDOW
    assert sum(e.query in junk for e in window.entries) == int(WINDOW * 0.1)
    judged = judge(served, index, window, log)
    assert not judged.swap(0.02), judged

    # Without the cap the attack fills the window and its plan gains (the issue's +0.406)
    open_window = read_window(log, WINDOW, source_share=1.0)
    assert all(e.query in junk for e in open_window.entries)
    poisoned = judge(served, index, open_window, log)
    assert poisoned.swap(0.02)


def test_a_swap_needs_the_held_back_part_and_the_canary_too(shift: dict[str, Path]) -> None:
    plan = read_plan(shift["plan-first"])
    fitted = Judgement(64, 0.5, 0.9, plan, held_current=0.5, held_candidate=0.5)
    assert not fitted.swap(0.02)  # gains only on the questions it was made from
    canary_worse = Judgement(64, 0.5, 0.9, plan, 0.5, 0.9, canary_current=0.8, canary_candidate=0.6)
    assert not canary_worse.swap(0.02)
    assert Judgement(64, 0.5, 0.9, plan, 0.5, 0.9, 0.8, 0.79).swap(0.02)


def test_a_genuine_shift_from_many_clients_still_swaps_under_the_cap(
    shift: dict[str, Path], tmp_path: Path
) -> None:
    log = tmp_path / "queries.jsonl"
    log.write_bytes(
        sourced_lines(topic("manual"), 300, sources=30)
        + sourced_lines(topic("note-"), 300, sources=30)
    )
    window = read_window(log, WINDOW, source_share=0.1)
    judged = judge(read_plan(shift["plan-first"]), open_index(shift["index"]), window, log)
    assert judged.held_gain > 0.1
    assert judged.swap(0.02), judged
