"""Several prefixes on a real hybrid server: the tiny Qwen3-Next model (1 attention + 3 Gated
DeltaNet KV-cache groups, align mode) on vLLM CPU.

1. The planner's block-pool count (planner/prefixes.py `HybridPool`) is what vLLM keeps: with
   --num-gpu-blocks-override 64, the predicted number of prefixes all stay cached after being
   warmed one after another, and one more evicts the oldest. Two cases: a prefix within one
   prefill chunk, and one that takes two chunks (the first chunk's state is not kept).
2. Four prefixes planned, warmed with `residency warm`, then interleaved traffic through the
   router in which every request finds its prefix in vLLM's cache (the hybrid twin of
   tests/test_prefixes_vllm.py).
"""

from __future__ import annotations

import random
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest
from conftest import HYBRID_SERVER_ARGS
from residency_cli import run_cli
from router_server import RouterProcess
from vllm_pool import ServerSpec, VllmServerPool
from vllm_server import VllmServer

from planner import CacheSettings
from planner.budget import Reserves
from planner.prefixes import pool_prefixes
from residency.capacity.report import build_capacity_report
from residency.capacity.request import DEFAULT_MAX_MODEL_LEN, CapacityRequest
from residency.context.builder import ContextBuilder
from residency.context.headers import PREFIX_HEADER
from residency.context.settings import ContextSettings
from residency.corpus.samples import EN_SAMPLE
from residency.index import build_index, open_index
from residency.planning.multi import hybrid_pool
from residency.planning.plan_model import read_plan
from residency.planning.run import sample_index_options, snapshot
from residency.query_log import read_query_log
from residency.tokenizer import ServerTokenizer

pytestmark = pytest.mark.vllm

SERVER_ARGS = HYBRID_SERVER_ARGS
POOL_BLOCKS = 64
SUFFIX = 10  # tokens after the prefix in every prompt (a request's own tokens)
PREFIXES = 4
ROUNDS = 3
HTTP_TIMEOUT_S = 300.0


def _cached(client: httpx.Client, ids: list[int]) -> int:
    body = {"model": "tiny", "prompt": ids, "max_tokens": 1}
    answer = client.post("/v1/completions", json=body)
    assert answer.status_code == 200, answer.text
    return int(answer.json()["usage"]["prompt_tokens_details"]["cached_tokens"])


def _warm_then_probe(client: httpx.Client, count: int, prefix: int, seed: int) -> list[bool]:
    """Empty the cache, warm `count` prompts of `prefix` + SUFFIX random tokens one after
    another (each until a resend finds its prefix), then probe them newest first: which ones
    are still cached, oldest last."""
    deadline = time.monotonic() + 60
    while not client.post("/reset_prefix_cache").is_success:  # refused while blocks are in use
        assert time.monotonic() < deadline, "/reset_prefix_cache never succeeded"
        time.sleep(0.2)
    rng = random.Random(seed)
    prompts = [[rng.randrange(10, 7000) for _ in range(prefix + SUFFIX)] for _ in range(count)]
    for n, ids in enumerate(prompts):
        sends = [_cached(client, ids) for _ in range(3)]
        assert max(sends) >= prefix, f"prompt {n} never found its {prefix}-token prefix: {sends}"
    return [_cached(client, ids) >= prefix for ids in reversed(prompts)]


# Prefixes per pool, by the server's attention block (which depends on the CPU and the dtype:
# 256 tokens with a float32 GDN state beside bfloat16 attention, 128 otherwise): 64 blocks, one
# null block and a headroom of 4 (one attention block, one running state per GDN group) leave
# 59 for prefixes of ceil(tokens / block) attention blocks and 3 state blocks each.
# One chunk (256 + SUFFIX tokens within a 512-token chunk): 59 // (1 + 3) = 14 with 256-token
# blocks, 59 // (2 + 3) = 11 with 128. Two chunks (1,024 tokens): 59 // (4 + 3) = 8 and
# 59 // (8 + 3) = 5.
PREDICTED: dict[str, dict[int, int]] = {
    "one-chunk": {256: 14, 128: 11},
    "two-chunks": {256: 8, 128: 5},
}
CHUNK_TOKENS = 512


@pytest.fixture(scope="module")
def pool_server(vllm_pool: VllmServerPool, hybrid_model_dir: Path) -> Iterator[VllmServer]:
    """The hybrid model with a 64-block pool and 512-token prefill chunks (this module's own:
    stopped when it ends)."""
    spec = ServerSpec(
        hybrid_model_dir,
        (
            *SERVER_ARGS,
            "--num-gpu-blocks-override",
            str(POOL_BLOCKS),
            "--max-num-batched-tokens",
            str(CHUNK_TOKENS),
        ),
        max_model_len=2048,
        name="hybrid-pool",
    )
    yield vllm_pool.get(spec)
    vllm_pool.release(spec)


@pytest.mark.parametrize("prefix_tokens", [256, 1024], ids=["one-chunk", "two-chunks"])
def test_planner_count_of_hybrid_prefixes_is_what_vllm_keeps(
    pool_server: VllmServer, request: pytest.FixtureRequest, prefix_tokens: int
) -> None:
    server = pool_server
    # A request's own tokens are the SUFFIX: the question, nothing retrieved, no answer.
    reserves = Reserves(
        question_tokens=SUFFIX, retrieved_tokens=0, output_tokens=0, template_tokens=0
    )
    request_ = CapacityRequest(
        server=server.base_url,
        cache=CacheSettings(
            platform="cpu",
            max_model_len=DEFAULT_MAX_MODEL_LEN,
            max_num_batched_tokens=CHUNK_TOKENS,
        ),
        reserves=reserves,
    )
    capacity = snapshot(build_capacity_report(request_))
    pooled = hybrid_pool(capacity)
    assert pooled is not None, capacity
    pool, headroom_blocks = pooled
    assert pool.num_blocks == POOL_BLOCKS
    assert pool.block_size in (128, 256)
    assert (pool.attention_groups, pool.state_groups) == (1, 3)
    assert headroom_blocks == 1 + 3  # one attention block and one running state per GDN group
    count = pool_prefixes(pool, prefix_tokens, headroom_blocks)
    assert count == PREDICTED[request.node.callspec.id][pool.block_size]

    with httpx.Client(base_url=server.base_url, timeout=HTTP_TIMEOUT_S) as client:
        together = _warm_then_probe(client, count, prefix_tokens, seed=1)
        assert all(together), together
        one_more = _warm_then_probe(client, count + 1, prefix_tokens, seed=2)
    assert one_more == [True] * count + [False]  # the oldest is evicted, every other one kept


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, timeout=900)


def test_four_hybrid_prefixes_warm_and_every_request_finds_its_prefix_cached(
    vllm_hybrid_server: VllmServer, tmp_path: Path
) -> None:
    server = vllm_hybrid_server
    index_dir = tmp_path / "index"
    build_index(
        EN_SAMPLE.docs,
        index_dir,
        sample_index_options(EN_SAMPLE, dense=False),
        ServerTokenizer(server.base_url),
    )
    plan_path = tmp_path / "plan.json"
    done = _cli(
        "plan",
        "--server",
        server.base_url,
        "--platform",
        "cpu",
        "--index",
        str(index_dir),
        "--log",
        str(EN_SAMPLE.queries),
        "--prefixes",
        str(PREFIXES),
        "-o",
        str(plan_path),
    )
    assert done.returncode == 0, done.stderr
    assert "hybrid block pool" in done.stdout, done.stdout
    plan = read_plan(plan_path)
    assert [p.id for p in plan.prefixes] == ["p0", "p1", "p2", "p3"]
    assert plan.capacity.is_hybrid
    assert plan.capacity.block_pool is not None
    assert plan.capacity.block_pool.retention_interval == 0  # the server's label
    arithmetic = plan.arithmetic
    assert arithmetic is not None
    assert arithmetic.resident_blocks is not None
    assert arithmetic.pool_blocks == plan.capacity.block_pool.num_blocks - 1
    assert arithmetic.concurrency_left >= 1
    block = plan.capacity.block_size
    # Each prefix: its attention blocks plus one state block in each of the 3 GDN groups.
    assert arithmetic.resident_blocks == sum(-(-p.tokens // block) + 3 for p in plan.prefixes)
    assert all(p.prefix.aligned_to == block for p in plan.prefixes)

    done = _cli("warm", "--plan", str(plan_path), "--server", server.base_url, "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    report = orjson.loads(done.stdout)
    assert [e["id"] for e in report["prefixes"]] == ["p0", "p1", "p2", "p3"]
    for entry in report["prefixes"]:  # probed after all four were warmed
        assert entry["resident"] is True, entry
        assert entry["cached_tokens"] >= entry["prefix_tokens"] - block

    builder = ContextBuilder(plan, open_index(index_dir), ContextSettings(retriever="bm25"))
    by_prefix: dict[str, list[str]] = {p.id: [] for p in plan.prefixes}
    for entry in read_query_log(EN_SAMPLE.queries).entries:
        picked = by_prefix[builder.retrieve(entry.query).prefix_id]
        if len(picked) < ROUNDS and entry.query not in picked:
            picked.append(entry.query)
    assert all(len(q) == ROUNDS for q in by_prefix.values()), by_prefix
    tokens = {p.id: p.tokens for p in plan.prefixes}

    with RouterProcess(
        plan_path, [server.base_url], tmp_path, ("--retriever", "bm25", "--no-warm")
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
                cached = answer.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
                assert cached >= tokens[prefix_id] - block, (prefix_id, n, answer.json())
    logged = [orjson.loads(x) for x in router.query_log.read_bytes().splitlines()]
    assert [r["prefix"] for r in logged] == [p for _ in range(ROUNDS) for p in by_prefix]
