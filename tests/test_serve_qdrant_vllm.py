"""`residency index --to qdrant` + `residency serve --retriever qdrant` retrieve what the
in-process router does, question for question, in front of the real vLLM CPU server.

Embedded Qdrant by default (a directory only the Qdrant router opens); with
``RESIDENCY_QDRANT_URL`` set, a server collection of its own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.parse
import uuid
from pathlib import Path

import httpx
import pytest
from router_server import RouterProcess
from vllm_server import REPO_ROOT, VllmServer

pytest.importorskip("qdrant_client", reason="pip install 'residency[qdrant]'")

from residency.planning.run import sample_index

pytestmark = pytest.mark.vllm

CORPUS = REPO_ROOT / "residency" / "data" / "corpora" / "harbor-lights" / "docs"
QA = REPO_ROOT / "residency" / "data" / "corpora" / "harbor-lights" / "qa.jsonl"
TODAY = "2025-06-15"
QUESTIONS = 30


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "residency", *args], capture_output=True, text=True, timeout=900
    )


def ask(router: RouterProcess, question: str) -> tuple[str, list[str]]:
    body = {"messages": [{"role": "user", "content": question}], "max_tokens": 1}
    response = httpx.post(f"{router.base_url}/v1/chat/completions", json=body, timeout=300)
    assert response.status_code == 200, response.text
    raw = response.headers["x-residency-retrieved"]
    return response.headers["x-residency-route"], [
        urllib.parse.unquote(s) for s in raw.split(",") if s
    ]


def test_serve_retriever_qdrant_retrieves_the_same_ids_as_in_process(
    vllm_dense_server: VllmServer, tiny_tokenizer_dir: Path, tmp_path: Path
) -> None:
    # The sample corpus's dense index under .cache/ (what `residency plan` uses; vectors are
    # reused by content hash, so only the first run embeds its 396 chunks).
    index_dir = sample_index(None).directory
    server = os.environ.get("RESIDENCY_QDRANT_URL")
    location = server or str(tmp_path / "qdrant")
    collection = f"t-serve-{uuid.uuid4().hex[:8]}" if server else "sample"
    uploaded = run_cli(
        "index",
        str(CORPUS),
        "-o",
        str(index_dir),
        "--tokenizer-dir",
        str(tiny_tokenizer_dir),
        "--to",
        "qdrant",
        location,
        "--collection",
        collection,
        "--json",
    )
    assert uploaded.returncode == 0, uploaded.stderr
    assert json.loads(uploaded.stdout)["build"]["embedded_chunks"] == 0  # nothing re-embedded
    plan = tmp_path / "plan.json"
    planned = run_cli(
        "plan",
        "--server",
        vllm_dense_server.base_url,
        "--platform",
        "cpu",
        "--index",
        str(index_dir),
        "-o",
        str(plan),
        "--prefixes",
        "1",
    )
    assert planned.returncode == 0, planned.stderr
    common = ("--today", TODAY, "--no-warm")
    qdrant = ("--retriever", "qdrant", "--qdrant", location, "--collection", collection)
    questions = [json.loads(line)["query"] for line in QA.read_text("utf-8").splitlines()]
    upstream = [vllm_dense_server.base_url]
    with (
        RouterProcess(plan, upstream, tmp_path, common) as in_process,
        RouterProcess(plan, upstream, tmp_path, (*common, *qdrant)) as through_qdrant,
    ):
        answers = [(ask(in_process, q), ask(through_qdrant, q)) for q in questions[:QUESTIONS]]
    differ = [(q, a, b) for q, (a, b) in zip(questions, answers, strict=False) if a != b]
    assert not differ, differ
    assert sum(bool(a[1]) for a, _ in answers) >= QUESTIONS // 2  # most questions retrieved some
