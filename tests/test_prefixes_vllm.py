"""Several resident prefixes on a real server: SmolLM2-135M-Instruct on vLLM CPU with a 1 GiB
KV cache (46,592 tokens, window 8,192), four prefixes planned, warmed and proven cached at the
same time, then interleaved traffic through the router in which every request goes out with the
prefix holding its best-ranked evidence and finds that prefix in vLLM's cache."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx
import orjson
import pytest
from residency_cli import run_cli
from router_server import RouterProcess
from vllm_server import VllmServer

from residency.context.builder import ContextBuilder
from residency.context.headers import PREFIX_HEADER
from residency.context.settings import ContextSettings
from residency.corpus.samples import EN_SAMPLE
from residency.index import open_index
from residency.planning.plan_model import read_plan
from residency.query_log import read_query_log

pytestmark = pytest.mark.vllm

PREFIXES = 4
ROUNDS = 3  # requests per prefix, interleaved p0, p1, p2, p3, p0, ...
HTTP_TIMEOUT_S = 300.0


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, timeout=900)


@pytest.fixture(scope="module")
def multi_plan(
    vllm_real_server: VllmServer,
    en_real_index: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Path, Path]:
    """(plan.json with four prefixes, its BM25 index) for the English sample."""
    root = tmp_path_factory.mktemp("prefixes-real")
    index_dir = en_real_index
    out = root / "plan.json"
    done = _cli(
        "plan",
        "--server",
        vllm_real_server.base_url,
        "--platform",
        "cpu",
        "--index",
        str(index_dir),
        "--log",
        str(EN_SAMPLE.queries),
        "--prefixes",
        str(PREFIXES),
        "-o",
        str(out),
    )
    assert done.returncode == 0, done.stderr
    assert "KV cache 46,592 tokens: 4 prefix(es)" in done.stdout
    return out, index_dir


def test_four_prefixes_fit_the_kv_cache(multi_plan: tuple[Path, Path]) -> None:
    plan = read_plan(multi_plan[0])
    assert [p.id for p in plan.prefixes] == ["p0", "p1", "p2", "p3"]
    arithmetic = plan.arithmetic
    assert arithmetic is not None
    assert arithmetic.kv_cache_tokens == 46_592
    window = plan.capacity.context_limit_tokens
    assert window is not None
    for p in plan.prefixes:
        assert 0 < p.tokens <= window
    assert arithmetic.resident_kv_tokens + arithmetic.headroom_tokens == 46_592
    assert arithmetic.concurrency_left >= 1
    single_window = plan.capacity.resident_budget_tokens
    assert sum(p.tokens for p in plan.prefixes) > 3 * single_window  # more than one window's worth


def test_every_prefix_warm_and_every_request_finds_its_prefix_cached(
    vllm_real_server: VllmServer, multi_plan: tuple[Path, Path], tmp_path: Path
) -> None:
    plan_path, index_dir = multi_plan
    plan = read_plan(plan_path)
    block = plan.capacity.block_size
    done = _cli("warm", "--plan", str(plan_path), "--server", vllm_real_server.base_url, "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    report = orjson.loads(done.stdout)
    assert [e["id"] for e in report["prefixes"]] == ["p0", "p1", "p2", "p3"]
    for entry in report["prefixes"]:  # probed after all four were warmed
        assert entry["resident"] is True
        assert entry["cached_tokens"] >= entry["prefix_tokens"] - block

    # Questions from the sample log, routed offline the way the router will route them.
    builder = ContextBuilder(plan, open_index(index_dir), ContextSettings(retriever="bm25"))
    by_prefix: dict[str, list[str]] = {p.id: [] for p in plan.prefixes}
    for entry in read_query_log(EN_SAMPLE.queries).entries:
        picked = by_prefix[builder.retrieve(entry.query).prefix_id]
        if len(picked) < ROUNDS and entry.query not in picked:
            picked.append(entry.query)
    assert all(len(q) == ROUNDS for q in by_prefix.values()), by_prefix
    tokens = {p.id: p.tokens for p in plan.prefixes}

    with RouterProcess(
        plan_path, [vllm_real_server.base_url], tmp_path, ("--retriever", "bm25", "--no-warm")
    ) as router:
        for n in range(ROUNDS):
            for prefix_id, questions in by_prefix.items():
                answer = httpx.post(
                    f"{router.base_url}/v1/chat/completions",
                    json={
                        "messages": [{"role": "user", "content": questions[n]}],
                        "max_tokens": 1,
                        "temperature": 0,
                    },
                    timeout=HTTP_TIMEOUT_S,
                )
                assert answer.status_code == 200, answer.text
                assert answer.headers[PREFIX_HEADER] == prefix_id
                usage = answer.json()["usage"]
                cached = usage["prompt_tokens_details"]["cached_tokens"]
                assert cached >= tokens[prefix_id] - block, (prefix_id, n, usage)
        metrics = httpx.get(f"{router.base_url}/metrics", timeout=30).text
    for prefix_id in by_prefix:
        line = f'residency_router_prefix_requests_total{{prefix="{prefix_id}"}} {ROUNDS}.0'
        assert line in metrics
    logged = [orjson.loads(x) for x in router.query_log.read_bytes().splitlines()]
    assert [r["prefix"] for r in logged] == [p for _ in range(ROUNDS) for p in by_prefix]


def test_watch_keeps_every_prefix_and_rewarms_each_after_a_reset(
    vllm_real_server: VllmServer, multi_plan: tuple[Path, Path], tmp_path: Path
) -> None:
    from residency.vllm_client import VllmClient

    plan_path, _ = multi_plan
    events_path = tmp_path / "watch.jsonl"
    with events_path.open("w") as out:
        watch = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "residency",
                "warm",
                "--plan",
                str(plan_path),
                "--server",
                vllm_real_server.base_url,
                "--watch",
                "--interval",
                "1",
                "--json",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:

        def events() -> list[dict[str, object]]:
            lines = events_path.read_text("utf-8").splitlines()
            return [orjson.loads(x) for x in lines if x.startswith("{")]

        def wait_for(name: str, after: int) -> dict[str, object]:
            """One `name` event per prefix after position `after`, by prefix id."""
            deadline = time.monotonic() + 240
            while time.monotonic() < deadline:
                seen = {str(e["prefix"]): e for e in events()[after:] if e["event"] == name}
                if len(seen) == PREFIXES:
                    return seen
                assert watch.poll() is None, events_path.read_text("utf-8")
                time.sleep(0.5)
            raise AssertionError(f"not every prefix had {name!r}: {events()}")

        warmed = wait_for("warm", 0)
        assert sorted(warmed) == ["p0", "p1", "p2", "p3"]
        assert all(e["resident"] is True for e in warmed.values())
        seen = len(events())
        with VllmClient(vllm_real_server.base_url) as client:
            deadline = time.monotonic() + 60
            while not client.reset_prefix_cache():  # refused while blocks are in use
                assert time.monotonic() < deadline, "/reset_prefix_cache never succeeded"
                time.sleep(0.2)
        rewarmed = wait_for("rewarm", seen)  # each prefix found missing and warmed again
        assert all(e["resident"] is True for e in rewarmed.values())
    finally:
        watch.terminate()
        watch.wait(timeout=30)


def test_the_shared_head_is_cached_once_for_every_prefix(
    vllm_real_server: VllmServer, multi_plan: tuple[Path, Path], tmp_path: Path
) -> None:
    """The planner's own count with the default shared head: held whole, the prefixes would
    need more than the whole KV cache; vLLM keeps every one of them cached at once because each
    starts with the same head blocks, stored once."""
    _, index_dir = multi_plan
    out = tmp_path / "plan.json"
    done = _cli(
        "plan",
        "--server",
        vllm_real_server.base_url,
        "--platform",
        "cpu",
        "--index",
        str(index_dir),
        "--log",
        str(EN_SAMPLE.queries),
        "-o",
        str(out),
    )
    assert done.returncode == 0, done.stderr
    plan = read_plan(out)
    a, block = plan.arithmetic, plan.capacity.block_size
    assert a is not None
    assert a.shared_kv_tokens > 0
    assert len(plan.prefixes) > PREFIXES
    whole = sum(-(-p.tokens // block) * block for p in plan.prefixes)
    assert whole > a.kv_cache_tokens  # could not all be cached without sharing the head
    assert a.resident_kv_tokens == whole - (len(plan.prefixes) - 1) * a.shared_kv_tokens
    assert a.resident_kv_tokens + a.headroom_tokens == a.kv_cache_tokens
    done = _cli("warm", "--plan", str(out), "--server", vllm_real_server.base_url, "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    report = orjson.loads(done.stdout)
    assert len(report["prefixes"]) == len(plan.prefixes)
    for entry in report["prefixes"]:  # probed after every prefix was warmed
        assert entry["resident"] is True, entry
        assert entry["cached_tokens"] >= entry["prefix_tokens"] - block, entry
