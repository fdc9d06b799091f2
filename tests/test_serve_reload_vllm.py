"""Reloading plan.json while `residency serve` runs (SIGHUP, --watch-plan), against the real
router process and the session's tiny dense model on vLLM CPU.

Plan A holds the whole sample corpus the window allows (~29K tokens); plan B leaves out A's first
section and reserves more for retrieval (~11K tokens), so B's prefix diverges from A's within the
first few hundred tokens: a request finds B's prefix cached only if the reload warmed it.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from residency_cli import run_cli
from router_server import RouterProcess
from test_serve_reload import replace, sha
from vllm_server import REPO_ROOT, VllmServer

from residency.context.headers import PREFIX_HEADER
from residency.index import IndexOptions, build_index
from residency.planning.plan_model import ResidencyPlan, read_plan
from residency.tokenizer import LocalTokenizer
from residency.vllm_client import find_samples, parse_prometheus
from residency.vllm_client.sse import DONE_DATA, data_events

pytestmark = pytest.mark.vllm

CORPUS = REPO_ROOT / "residency" / "data" / "corpora" / "harbor-lights" / "docs"
BLOCK = 128  # the CPU build's block size for the tiny dense model
SERVER_WINDOW = 32768  # conftest MAX_MODEL_LEN
ROUTER_ARGS = ("--retriever", "bm25", "--today", "2025-06-15")
QUESTION = "灯台の点検の手順を教えて"
SWAP_TIMEOUT_S = 300.0


@pytest.fixture(scope="module")
def plans(
    vllm_dense_server: VllmServer,
    tiny_tokenizer_dir: Path,
    dense_model_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, Path]:
    """a: ~29K tokens; b: another, smaller prefix; big: made for a 65,536-token window."""
    root = tmp_path_factory.mktemp("reload")
    index_dir = root / "index"
    build_index(
        CORPUS, index_dir, IndexOptions(dense=False), LocalTokenizer(tiny_tokenizer_dir), None
    )
    url = vllm_dense_server.base_url
    common = ("--platform", "cpu", "--index", str(index_dir), "--prefixes", "1")
    out = {name: root / f"{name}.json" for name in ("a", "b", "big")}
    done = run_cli("plan", "--server", url, *common, "-o", str(out["a"]))
    assert done.returncode == 0, done.stderr
    first = read_plan(out["a"]).resident[0].section_id
    done = run_cli(
        "plan",
        "--server",
        url,
        *common,
        "--exclude",
        first,
        "--reserve-retrieved",
        "20000",
        "-o",
        str(out["b"]),
    )
    assert done.returncode == 0, done.stderr
    done = run_cli(
        "plan",
        "--model",
        str(dense_model_dir),
        "--kv-cache-memory-bytes",
        str(1 << 30),
        "--max-model-len",
        "65536",
        "--tokenizer-dir",
        str(tiny_tokenizer_dir),
        *common,
        "-o",
        str(out["big"]),
    )
    assert done.returncode == 0, done.stderr
    return out


def health(router: RouterProcess) -> dict[str, Any]:
    answer: dict[str, Any] = httpx.get(f"{router.base_url}/health", timeout=10).json()
    return answer


def reloads(router: RouterProcess, result: str) -> float:
    text = httpx.get(f"{router.base_url}/metrics", timeout=10).text
    found = find_samples(parse_prometheus(text), "residency_router_plan_reloads_total")
    return sum(s.value for s in found if s.labels == {"result": result})


def wait_for(condition: Any, what: str, timeout_s: float = SWAP_TIMEOUT_S) -> float:
    """Poll until condition() is true; the monotonic time it became so."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)
    return time.monotonic()


def chat(router: RouterProcess) -> httpx.Response:
    body = {"messages": [{"role": "user", "content": QUESTION}], "max_tokens": 1}
    response = httpx.post(
        f"{router.base_url}/v1/chat/completions", json={**body, "temperature": 0}, timeout=300
    )
    assert response.status_code == 200, response.text
    return response


def assert_served_with(response: httpx.Response, plan: ResidencyPlan) -> None:
    """The answer went out with `plan`'s prefix, found in vLLM's cache (all but <1 block)."""
    usage = response.json()["usage"]
    tokens = plan.prefix.token_count
    assert tokens <= usage["prompt_tokens"] < tokens + 3000, (tokens, usage)
    assert usage["prompt_tokens_details"]["cached_tokens"] >= tokens - BLOCK, (tokens, usage)
    assert response.headers[PREFIX_HEADER] == "p0"


def log_lines(router: RouterProcess, needle: str) -> list[str]:
    return [line for line in router.log_text().splitlines() if needle in line]


@pytest.fixture
def plan_path(plans: dict[str, Path], tmp_path: Path) -> Path:
    """A copy of plan A that the test rewrites under the router."""
    path = tmp_path / "plan.json"
    path.write_bytes(plans["a"].read_bytes())
    return path


@pytest.fixture
def router(
    vllm_dense_server: VllmServer, plan_path: Path, tmp_path: Path
) -> Iterator[RouterProcess]:
    with RouterProcess(plan_path, [vllm_dense_server.base_url], tmp_path, ROUTER_ARGS) as proc:
        yield proc


def test_sighup_warms_the_new_plan_before_traffic_moves_and_in_flight_requests_finish(
    router: RouterProcess, plans: dict[str, Path], plan_path: Path
) -> None:
    a, b = read_plan(plans["a"]), read_plan(plans["b"])
    pairs = zip(a.prefix.text, b.prefix.text, strict=False)
    shared = next(i for i, (x, y) in enumerate(pairs) if x != y)
    assert shared < 1000  # B's prefix is not cached by A's
    assert b.prefix.token_count < a.prefix.token_count - 10_000
    assert health(router)["plan_sha256"] == sha(plans["a"])
    before = chat(router)
    assert_served_with(before, a)

    # A long stream under plan A, in flight while the plan changes: as many tokens as the window
    # leaves after A's prompt. 1,000 tokens once ended a second before B's warm-up finished (CI,
    # 2 cores); the window's ~2,900 give three times the margin on any machine, since decoding and
    # warming slow down together.
    events: list[tuple[float, Any]] = []
    max_tokens = SERVER_WINDOW - before.json()["usage"]["prompt_tokens"] - 16
    assert max_tokens >= 2000, max_tokens
    body = {
        "messages": [{"role": "user", "content": QUESTION}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    status: list[int] = []

    def read_stream() -> None:
        url = f"{router.base_url}/v1/chat/completions"
        with httpx.stream("POST", url, json=body, timeout=600) as response:
            status.append(response.status_code)
            for data in data_events(response.iter_bytes()):
                events.append((time.monotonic(), data))

    reader = threading.Thread(target=read_stream)
    reader.start()
    wait_for(lambda: len(events) > 0, "the stream's first event", 120)
    replace(plan_path, plans["b"].read_bytes())
    os.kill(router.pid or 0, signal.SIGHUP)
    swapped_at = wait_for(lambda: health(router)["plan_sha256"] == sha(plans["b"]), "the swap")
    first_b = chat(router)  # the first request routed to B
    reader.join(600)

    assert status == [200]
    assert events[-1][1] == DONE_DATA
    margin = events[-1][0] - swapped_at
    assert margin > 0, f"the stream ended {-margin:.1f} s before the swap ({max_tokens} tokens)"
    last = [json.loads(d) for _, d in events[:-1]][-1]
    assert "error" not in last
    usage = last["usage"]  # the old plan's prefix, cached
    assert usage["prompt_tokens"] > a.prefix.token_count
    assert usage["prompt_tokens_details"]["cached_tokens"] >= a.prefix.token_count - BLOCK
    assert usage["completion_tokens"] == max_tokens

    assert_served_with(first_b, b)  # B was in vLLM's cache before its first request
    lines = log_lines(router, "plan reloaded (SIGHUP)")
    assert len(lines) == 1
    assert f"{sha(plans['a'])[:12]} -> {sha(plans['b'])[:12]}" in lines[0]
    assert "1 prefix(es) warmed on 1 upstream(s) (0: 1/1 proven cached" in lines[0]
    assert reloads(router, "ok") == 1
    assert reloads(router, "refused") == 0
    info = f'residency_router_plan_info{{sha256="{sha(plans["b"])}"}} 1.0'
    metrics = httpx.get(f"{router.base_url}/metrics", timeout=10).text
    assert info in metrics
    assert sha(plans["a"]) not in metrics


@pytest.mark.parametrize(
    ("content", "why"),
    [
        pytest.param(b'{"format_version": 1, "strat', "not valid JSON", id="corrupt-json"),
        pytest.param("big", "beyond --upstream", id="prefix-beyond-the-window"),
    ],
)
def test_a_bad_plan_is_refused_in_one_line_and_the_old_plan_keeps_serving(
    router: RouterProcess,
    plans: dict[str, Path],
    plan_path: Path,
    content: bytes | str,
    why: str,
) -> None:
    data = plans[content].read_bytes() if isinstance(content, str) else content
    replace(plan_path, data)
    os.kill(router.pid or 0, signal.SIGHUP)
    wait_for(lambda: reloads(router, "refused") == 1, "the refusal", 120)
    lines = log_lines(router, "plan reload refused")
    assert len(lines) == 1, lines
    assert why in lines[0]
    assert f"still serving plan {sha(plans['a'])[:12]}" in lines[0]
    if content == "big":  # 35,851 + 3,392 = 39,243 tokens against the server's 32,768
        big = read_plan(plans["big"])
        need = big.prefix.token_count + (big.capacity.per_request_tokens or 0)
        assert big.prefix.token_count > SERVER_WINDOW
        assert f"takes {big.prefix.token_count:,} tokens" in lines[0]
        assert f"= {need:,}, beyond" in lines[0]
        assert f"max_model_len {SERVER_WINDOW:,}" in lines[0]
    assert reloads(router, "ok") == 0
    assert health(router)["plan_sha256"] == sha(plans["a"])
    assert_served_with(chat(router), read_plan(plans["a"]))


def test_watch_plan_reloads_a_changed_file_without_a_signal(
    vllm_dense_server: VllmServer, plans: dict[str, Path], plan_path: Path, tmp_path: Path
) -> None:
    args = (*ROUTER_ARGS, "--watch-plan")
    with RouterProcess(plan_path, [vllm_dense_server.base_url], tmp_path, args) as router:
        replace(plan_path, plans["b"].read_bytes())
        wait_for(lambda: health(router)["plan_sha256"] == sha(plans["b"]), "--watch-plan")
        assert_served_with(chat(router), read_plan(plans["b"]))
        assert len(log_lines(router, "plan reloaded (--watch-plan)")) == 1
        assert reloads(router, "ok") == 1
