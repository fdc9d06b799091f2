"""How much of the KV pool to keep resident (issue 43): the English sample planned against the
KV-event server (tiny dense model on vLLM CPU, 96 blocks of 128 tokens) with
--max-resident-share 0.25 / 0.5 / 0.75 / 0.9, then mixed traffic through a router with KV events
on: questions through the router, each followed by a long unrelated prompt sent to vLLM past it
(as in the KV-event replay), a fixed gap between requests.

Reported per share: the resident route's hit ratio (cached / prompt tokens of the questions the
router sent to a resident prefix), the time to the answer of both kinds of traffic (max_tokens
1: the prefill, i.e. TTFT) at p50 / p90, and the re-warm cost (requests and prefilled tokens).
A measurement on a shared 2-core machine: here, not in tests/. The per-request reserves keep
their defaults (256 + 2,048 + 1,024 + 64 = 3,392 tokens, 27 blocks): the concurrency reserve
binds above 72 % of the pool, so 0.75 and 0.9 plan what the reserve allows. (Smaller reserves
let the router's prompts outgrow max_model_len: a question plus its retrieved passages beside a
prefix planned to the wider window.)
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import orjson
import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "tests"))  # the server harnesses live beside the tests
from kv_events_traffic import (  # noqa: E402
    HTTP_TIMEOUT_S,
    MAX_MODEL_LEN,
    events_ready,
    events_server_args,
    filler_words,
    metric,
    questions,
    wait_for,
)
from router_server import RouterProcess  # noqa: E402
from vllm_server import VllmServer  # noqa: E402

from residency.corpus.samples import EN_SAMPLE  # noqa: E402
from residency.index import build_index  # noqa: E402
from residency.planning.plan_model import read_plan  # noqa: E402
from residency.planning.run import sample_index_options  # noqa: E402
from residency.tokenizer import ServerTokenizer  # noqa: E402

SERVER_ARGS = ("--enforce-eager", "--enable-prompt-tokens-details", "--enable-prefix-caching")
SHARES = (0.25, 0.5, 0.75, 0.9)
QUESTIONS = 16
OTHER_TOKENS = 2_000  # one unrelated prompt past the router: about a sixth of the pool
GAP_S = 1.0

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def events_server(
    model_dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VllmServer]:
    log = tmp_path_factory.mktemp("share-server") / "vllm.log"
    server = VllmServer(
        model_dirs["dense"],
        max_model_len=MAX_MODEL_LEN,
        log_path=log,
        extra_args=events_server_args(SERVER_ARGS),
    ).start()
    try:
        yield server
    finally:
        server.stop()


def plan_at(server: VllmServer, index_dir: Path, share: float, out: Path) -> Path:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "residency",
            "plan",
            "--server",
            server.base_url,
            "--platform",
            "cpu",
            "--index",
            str(index_dir),
            "--log",
            str(EN_SAMPLE.queries),
            "--max-resident-share",
            str(share),
            "-o",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=REPO_ROOT,
    )
    assert done.returncode == 0, done.stderr
    return out


def timed(url: str, body: dict[str, object]) -> tuple[float, dict[str, object], httpx.Headers]:
    started = time.perf_counter()
    answer = httpx.post(url, json=body, timeout=HTTP_TIMEOUT_S)
    assert answer.status_code == 200, answer.text
    return time.perf_counter() - started, answer.json(), answer.headers


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)]


def test_resident_share_against_hit_ratio_and_ttft(
    events_server: VllmServer,
    tmp_path: Path,
    record_property: Callable[[str, object], None],
) -> None:
    index_dir = tmp_path / "index"
    build_index(
        EN_SAMPLE.docs,
        index_dir,
        sample_index_options(EN_SAMPLE, dense=False),
        ServerTokenizer(events_server.base_url),
    )
    words = filler_words(events_server, OTHER_TOKENS)
    rows: dict[float, dict[str, float]] = {}
    for share in SHARES:
        plan_path = plan_at(events_server, index_dir, share, tmp_path / f"plan-{share}.json")
        plan = read_plan(plan_path)
        resident = sum(p.tokens for p in plan.all_prefixes())
        httpx.post(f"{events_server.base_url}/reset_prefix_cache", timeout=60)
        args = ("--retriever", "bm25", "--rewarm-interval", "0.5")
        with RouterProcess(plan_path, [events_server.base_url], tmp_path, args) as router:
            count = len(plan.all_prefixes())
            wait_for(lambda r=router, c=count: events_ready(r, c), "prefixes whole")
            base_requests = metric(router, "residency_router_keep_warm_requests_total")
            base_tokens = metric(router, "residency_router_keep_warm_prefill_tokens_total")
            routed: list[float] = []
            other: list[float] = []
            prompt = cached = all_prompt = all_cached = 0
            for n, question in enumerate(questions(QUESTIONS)):
                body = {"messages": [{"role": "user", "content": question}], "max_tokens": 1}
                took, answer, headers = timed(f"{router.base_url}/v1/chat/completions", body)
                routed.append(took)
                usage = answer["usage"]
                assert isinstance(usage, dict)
                all_prompt += usage["prompt_tokens"]
                all_cached += usage["prompt_tokens_details"]["cached_tokens"]
                if headers.get("x-residency-route") == "resident":
                    prompt += usage["prompt_tokens"]
                    cached += usage["prompt_tokens_details"]["cached_tokens"]
                text = f"#other{n}-{time.monotonic_ns()}" + " zq" * words
                body = {"model": "tiny", "prompt": text, "max_tokens": 1}
                took, _, _ = timed(f"{events_server.base_url}/v1/completions", body)
                other.append(took)
                time.sleep(GAP_S)  # think time: part of the replayed traffic
            assert plan.arithmetic is not None
            rows[share] = {
                "prefixes": len(plan.all_prefixes()),
                "resident_tokens": resident,
                "resident_kv_share": plan.arithmetic.resident_kv_tokens
                / plan.arithmetic.kv_cache_tokens,
                "resident_route_questions": metric(
                    router, "residency_router_requests_total", route="resident"
                ),
                "hit_ratio_all": all_cached / all_prompt if all_prompt else float("nan"),
                "found_prefix_short": metric(router, "residency_router_prefix_evictions_total"),
                "hit_ratio_resident": cached / prompt if prompt else float("nan"),
                "routed_p50_s": statistics.median(routed),
                "routed_p90_s": pct(routed, 0.9),
                "other_p50_s": statistics.median(other),
                "other_p90_s": pct(other, 0.9),
                "rewarm_requests": metric(router, "residency_router_keep_warm_requests_total")
                - base_requests,
                "rewarm_prefill_tokens": metric(
                    router, "residency_router_keep_warm_prefill_tokens_total"
                )
                - base_tokens,
                "evictions": metric(router, "residency_router_prefix_block_evictions_total"),
            }
            print(f"\nshare {share}: {orjson.dumps(rows[share]).decode()}", flush=True)
    record_property("resident_share", rows)
    assert all(r["prefixes"] >= 1 for r in rows.values())
    # more of the pool planned resident means more resident tokens
    tokens = [rows[s]["resident_kv_share"] for s in SHARES]
    assert tokens == sorted(tokens), rows
