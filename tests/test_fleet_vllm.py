"""A fleet of two real vLLM CPU replicas (the tiny dense model, 80-block KV caches that hold
about half of the sample corpus's prefixes each): `residency plan --replica-server` places the
prefixes, `residency serve` warms each replica with its own and sends every question to a
replica that holds its prefix, where vLLM's usage shows the prefix cached."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest
from residency_cli import run_cli
from router_server import RouterProcess
from vllm_pool import ServerSpec, VllmServerPool
from vllm_server import REPO_ROOT, VllmServer

from residency.index import IndexOptions, build_index, open_index
from residency.planning.plan_model import read_plan
from residency.query_log import read_query_log
from residency.serve.context import ContextBuilder
from residency.serve.headers import PREFIX_HEADER
from residency.serve.settings import ServeSettings
from residency.tokenizer import LocalTokenizer

pytestmark = pytest.mark.vllm

SAMPLE = REPO_ROOT / "residency" / "data" / "corpora" / "harbor-lights"
BLOCK = 128  # the CPU build's block size for the tiny dense model
REPLICA_KV_BLOCKS = 80  # 10,240 tokens: a replica holds about half the fleet's prefixes
REPLICA_MAX_MODEL_LEN = 4096
REPLICA_ARGS = (
    "--enforce-eager", "--enable-prompt-tokens-details", "--enable-prefix-caching",
    "--num-gpu-blocks-override", str(REPLICA_KV_BLOCKS),
)  # fmt: skip
ROUTER_ARGS = ("--retriever", "bm25")


def replica_spec(model_dir: Path, n: int) -> ServerSpec:
    """Replica `n` (its own server: the environment differs, so the pool never shares them)."""
    return ServerSpec(
        model_dir,
        REPLICA_ARGS,
        max_model_len=REPLICA_MAX_MODEL_LEN,
        kv_cache_space_gib=None,
        env=(("RESIDENCY_TEST_REPLICA", str(n)),),
        name=f"replica-{n}",
    )


@pytest.fixture(scope="module")
def sample_index(tmp_path_factory: pytest.TempPathFactory, tiny_tokenizer_dir: Path) -> Path:
    """A BM25-only index of the sample corpus, token counts from the tiny tokenizer."""
    index_dir = tmp_path_factory.mktemp("fleet") / "index"
    build_index(
        SAMPLE / "docs", index_dir, IndexOptions(dense=False), LocalTokenizer(tiny_tokenizer_dir)
    )
    return index_dir


def test_each_question_goes_to_a_replica_holding_its_prefix(
    private_vllm: VllmServerPool, dense_model_dir: Path, sample_index: Path, tmp_path: Path
) -> None:
    replicas: list[VllmServer] = [
        private_vllm.private(replica_spec(dense_model_dir, n)) for n in range(2)
    ]
    urls = [r.base_url for r in replicas]
    plan_path = tmp_path / "plan.json"
    done = run_cli(
        "plan", "--replica-server", urls[0], "--replica-server", urls[1], "--platform", "cpu",
        "--index", str(sample_index), "--log", str(SAMPLE / "queries.jsonl"),
        "-o", str(plan_path),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "Placement over 2 replicas" in done.stdout
    plan = read_plan(plan_path)
    placement = plan.placement
    assert placement is not None
    assert plan.capacity.kv_cache_tokens == REPLICA_KV_BLOCKS * BLOCK
    held = [set(r.prefix_ids) for r in placement.replicas]
    assert held[0]
    assert held[1]
    assert held[0] != held[1]  # sharded: the fleet holds more than one replica does
    for r in placement.replicas:
        assert r.resident_kv_tokens <= r.room_tokens < REPLICA_KV_BLOCKS * BLOCK

    settings = ServeSettings(plan=plan_path, upstreams=tuple(urls), log=None, retriever="bm25")
    builder = ContextBuilder(plan, open_index(sample_index), settings)
    questions: dict[str, str] = {}
    for entry in read_query_log(SAMPLE / "queries.jsonl").entries:
        routed = builder.retrieve(entry.query)
        if routed.route == "resident":
            questions.setdefault(routed.prefix_id, entry.query)
    assert len(questions) >= 2
    tokens = {p.id: p.tokens for p in plan.all_prefixes()}
    with RouterProcess(plan_path, urls, tmp_path, ROUTER_ARGS) as router:
        for prefix_id, question in questions.items():
            answer = httpx.post(
                f"{router.base_url}/v1/chat/completions",
                json={"messages": [{"role": "user", "content": question}], "max_tokens": 1},
                timeout=300,
            )
            assert answer.status_code == 200, answer.text
            assert answer.headers[PREFIX_HEADER] == prefix_id
            cached = answer.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
            assert cached >= tokens[prefix_id] - BLOCK, (prefix_id, cached, router.log_tail())
        deadline = time.monotonic() + 10
        while True:
            text = router.query_log.read_text("utf-8") if router.query_log.exists() else ""
            records = [json.loads(x) for x in text.splitlines()]
            if len(records) >= len(questions) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
    assert len(records) == len(questions)
    for record in records:
        assert int(record["upstream"]) in placement.holders(record["prefix"]), record
