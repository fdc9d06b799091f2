"""The test harness itself: tiny models load, and real vLLM CPU servers answer as expected."""

from __future__ import annotations

import re
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import HYBRID_DTYPE_BYTES, HYBRID_KV_GIB, SERVER_DTYPE_BYTES, SERVER_KV_GIB
from tokenizers import Tokenizer
from transformers import AutoTokenizer
from vllm_pool import ServerSpec, VllmServerPool
from vllm_server import VllmServer, VllmServerError

from residency.corpus.samples import DATA_ROOT
from residency.models.tiny import HYBRID_SPEC, TinyModelSpec, build_tiny_model
from residency.models.tokenizer import (
    IM_END,
    IM_START,
    SPECIAL_TOKENS,
    corpus_texts,
    train_tokenizer,
)
from residency.vllm_client.metrics import find_samples, parse_prometheus

REPO_ROOT = Path(__file__).resolve().parent.parent
JAPANESE = re.compile(r"[\u3040-\u30ff\u4e00-\u9fff]")
HTTP_TIMEOUT_S = 120.0


def _japanese_passage(min_chars: int = 200) -> str:
    """A passage of the corpus with Japanese text in it."""
    for text in corpus_texts(DATA_ROOT):
        if len(JAPANESE.findall(text)) >= min_chars // 4:
            return text[:2000]
    pytest.fail("the corpus under residency/data/corpora/ holds no Japanese text")


def _labels(metrics_text: str, metric: str) -> dict[str, str]:
    """Labels of the first sample of metric in a Prometheus text exposition."""
    found = find_samples(parse_prometheus(metrics_text), metric)
    assert found, f"{metric} not found in /metrics"
    return found[0].labels


def _post(server: VllmServer, path: str, payload: dict[str, Any]) -> dict[str, Any]:
    response = httpx.post(f"{server.base_url}{path}", json=payload, timeout=HTTP_TIMEOUT_S)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


# --- tiny models, no server -------------------------------------------------------------------


def test_tokenizer_round_trips_corpus_japanese(tiny_tokenizer_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_tokenizer_dir)
    passage = _japanese_passage()
    ids = tokenizer.encode(passage, add_special_tokens=False)
    assert tokenizer.decode(ids) == passage
    # BPE learnt merges from the corpus: fewer tokens than UTF-8 bytes.
    assert len(ids) < len(passage.encode())


def test_tokenizer_special_tokens_and_chat_template(tiny_tokenizer_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_tokenizer_dir)
    for token in SPECIAL_TOKENS:
        assert len(tokenizer.encode(token, add_special_tokens=False)) == 1, token
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "灯台はいくつ？"}], tokenize=False, add_generation_prompt=True
    )
    assert prompt == f"{IM_START}user\n灯台はいくつ？{IM_END}\n{IM_START}assistant\n"


def test_model_dir_tokenizer_matches_trained_tokenizer(
    dense_model_dir: Path, hybrid_model_dir: Path, tiny_tokenizer_dir: Path
) -> None:
    # transformers 5 loads these dirs as Qwen2Tokenizer, which rebuilds its own normalizer and
    # pre-tokenizer: ids must still equal those of the trained tokenizer.json (what vLLM serves).
    passage = _japanese_passage() + "\n  Harbor lights: 1,024 tokens!  \r\n"
    expected = Tokenizer.from_file(str(tiny_tokenizer_dir / "tokenizer.json")).encode(passage).ids
    for model_dir in (dense_model_dir, hybrid_model_dir):
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        assert tokenizer.encode(passage, add_special_tokens=False) == expected, model_dir.name


def test_train_tokenizer_is_deterministic(tmp_path: Path) -> None:
    texts = [_japanese_passage(), "harbor lights and 港の灯り"]
    first = train_tokenizer(texts, tmp_path / "a", vocab_size=1000)
    second = train_tokenizer(texts, tmp_path / "b", vocab_size=1000)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (first / name).read_bytes() == (second / name).read_bytes(), name


def test_build_tiny_model_skips_identical_build(tmp_path: Path, tiny_tokenizer_dir: Path) -> None:
    spec = TinyModelSpec(num_hidden_layers=1, intermediate_size=64, max_position_embeddings=1024)
    out_dir = build_tiny_model(spec, tmp_path / "m", tiny_tokenizer_dir)
    weights = out_dir / "model.safetensors"
    built_ns = weights.stat().st_mtime_ns
    assert build_tiny_model(spec, out_dir, tiny_tokenizer_dir) == out_dir
    assert weights.stat().st_mtime_ns == built_ns
    # A different spec rebuilds in place; no staging directory is left behind.
    build_tiny_model(spec.model_copy(update={"seed": 1}), out_dir, tiny_tokenizer_dir)
    assert weights.stat().st_mtime_ns != built_ns
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


def test_dense_spec_rejects_mismatched_hidden_size() -> None:
    with pytest.raises(ValueError, match="hidden_size"):
        TinyModelSpec(num_attention_heads=4, head_dim=64, hidden_size=128)


# --- a real dense server ----------------------------------------------------------------------


@pytest.mark.vllm
def test_dense_server_health_models_tokenize(
    vllm_dense_server: VllmServer, tiny_tokenizer_dir: Path
) -> None:
    server = vllm_dense_server
    assert httpx.get(f"{server.base_url}/health", timeout=HTTP_TIMEOUT_S).status_code == 200

    models = httpx.get(f"{server.base_url}/v1/models", timeout=HTTP_TIMEOUT_S).json()
    [model] = models["data"]
    assert model["id"] == "tiny"
    assert model["max_model_len"] == 32768

    passage = _japanese_passage()
    tokenized = _post(server, "/tokenize", {"model": "tiny", "prompt": passage})
    local = Tokenizer.from_file(str(tiny_tokenizer_dir / "tokenizer.json")).encode(passage).ids
    assert tokenized["tokens"] == local
    assert tokenized["count"] == len(local)
    assert tokenized["max_model_len"] == 32768


@pytest.mark.vllm
def test_dense_server_chat_completion(vllm_dense_server: VllmServer) -> None:
    body = _post(
        vllm_dense_server,
        "/v1/chat/completions",
        {
            "model": "tiny",
            "messages": [{"role": "user", "content": "潮見湾の灯台はいくつ？"}],
            "max_tokens": 1,
            "temperature": 0,
        },
    )
    assert body["choices"][0]["finish_reason"] in {"length", "stop"}
    assert body["usage"]["completion_tokens"] == 1
    assert body["usage"]["prompt_tokens"] > 5


@pytest.mark.vllm
def test_dense_server_cache_config_info(vllm_dense_server: VllmServer) -> None:
    metrics = httpx.get(f"{vllm_dense_server.base_url}/metrics", timeout=HTTP_TIMEOUT_S).text
    labels = _labels(metrics, "vllm:cache_config_info")
    block_size = int(labels["block_size"])
    num_blocks = int(labels["num_gpu_blocks"])
    assert block_size == 128  # the CPU backend's default when --block-size is not given
    assert labels["enable_prefix_caching"] == "True"
    # VLLM_CPU_KVCACHE_SPACE: 1 GiB in bfloat16, 2 GiB in float32 (tests/vllm_pool.py).
    assert labels["kv_cache_memory_bytes"] == str(SERVER_KV_GIB << 30)
    # One block holds block_size tokens of K and V for every layer: 4 layers x 2 kv heads x
    # (64 + 64) x 2 bytes (bf16) x 128 = 262,144 bytes -> 4,096 blocks in 1 GiB (float32: twice
    # the bytes in twice the space, the same blocks).
    spec = TinyModelSpec()
    page_bytes = (
        spec.num_hidden_layers
        * spec.num_key_value_heads
        * 2
        * spec.head_dim
        * SERVER_DTYPE_BYTES
        * block_size
    )
    assert num_blocks == (SERVER_KV_GIB << 30) // page_bytes == 4096
    assert int(labels["kv_cache_size_tokens"]) == num_blocks * block_size


@pytest.mark.vllm
def test_dense_server_prefix_cache_hits_on_repeat(vllm_dense_server: VllmServer) -> None:
    server = vllm_dense_server
    # A fresh nonce first: this prompt's blocks cannot be cached by an earlier test or run.
    prompt = f"{uuid.uuid4()}\n" + (_japanese_passage() * 8)
    count = _post(server, "/tokenize", {"model": "tiny", "prompt": prompt})["count"]
    assert 1500 < count < 8000

    def cached_tokens() -> int:
        payload = {"model": "tiny", "prompt": prompt, "max_tokens": 1, "temperature": 0}
        usage = _post(server, "/v1/completions", payload)["usage"]
        assert usage["prompt_tokens"] == count
        value: int = usage["prompt_tokens_details"]["cached_tokens"]
        return value

    assert cached_tokens() == 0
    # Only full 128-token blocks are cached, and the last prompt token is always recomputed.
    assert cached_tokens() == (count - 1) // 128 * 128
    # VLLM_SERVER_DEV_MODE=1 exposes /reset_prefix_cache: after it, the prompt misses again.
    reset = httpx.post(f"{server.base_url}/reset_prefix_cache", timeout=HTTP_TIMEOUT_S)
    assert reset.status_code == 200, reset.text
    assert cached_tokens() == 0


# --- a real hybrid server ---------------------------------------------------------------------


@pytest.mark.vllm
def test_hybrid_server_starts_and_completes(vllm_hybrid_server: VllmServer) -> None:
    server = vllm_hybrid_server
    body = _post(
        server,
        "/v1/completions",
        {"model": "tiny", "prompt": "港の灯り", "max_tokens": 2, "ignore_eos": True},
    )
    assert body["usage"]["completion_tokens"] == 2

    labels = _labels(httpx.get(f"{server.base_url}/metrics").text, "vllm:cache_config_info")
    assert labels["mamba_cache_mode"] == "align"  # set automatically with prefix caching
    # The attention block grows until its page covers one GDN state (vllm/platforms/interface.py
    # _align_hybrid_block_size). Per GDN layer, in the model dtype d (2 B bf16, 4 B float32):
    # conv state (2*2*64 + 4*64) x 3 x d, plus the SSM state 4 x 64 x 64 elements, float32 on an
    # AVX512-BF16 CPU (vllm/platforms/cpu.py), else the conv dtype. The attention layer stores
    # 2 kv heads x (64 + 64) x d per token, so in bfloat16 on an AVX512-BF16 CPU:
    # 3,072 + 65,536 = 68,608 B against 512 B per token: 128 x ceil(68,608 / 65,536) = 256-token
    # blocks; with a 16-bit state (35,840 B), or all in float32 (71,680 B against 1,024 B per
    # token), 128. The label is vLLM's resolved value ("auto": the conv-state dtype).
    d = HYBRID_DTYPE_BYTES  # bfloat16 on every CPU (vLLM's CPU GDN kernel)
    ssm_bytes = 4 if labels["mamba_ssm_cache_dtype"] == "float32" else d
    spec = HYBRID_SPEC
    conv_dim = 2 * spec.linear_num_key_heads * spec.linear_key_head_dim + (
        spec.linear_num_value_heads * spec.linear_value_head_dim
    )
    mamba_page_bytes = (
        conv_dim * (spec.linear_conv_kernel_dim - 1) * d
        + (spec.linear_num_value_heads * spec.linear_key_head_dim * spec.linear_value_head_dim)
        * ssm_bytes
    )
    attention_bytes_per_token = spec.num_key_value_heads * 2 * spec.head_dim * d
    expected_block_size = 128 * -(-mamba_page_bytes // (128 * attention_bytes_per_token))
    assert int(labels["block_size"]) == expected_block_size
    assert expected_block_size == (256 if (d, ssm_bytes) == (2, 4) else 128)
    # 4 groups of 1 layer share one pool of equal pages.
    page_bytes = expected_block_size * attention_bytes_per_token
    assert int(labels["num_gpu_blocks"]) == (HYBRID_KV_GIB << 30) // page_bytes


@pytest.mark.vllm
def test_server_that_dies_fails_fast_with_its_log(
    private_vllm: VllmServerPool, tmp_path: Path
) -> None:
    not_a_model = tmp_path / "not-a-model"
    not_a_model.mkdir()
    with pytest.raises(VllmServerError, match="exited with code") as excinfo:
        private_vllm.private(ServerSpec(not_a_model, name="broken"))
    assert str(not_a_model) in str(excinfo.value)  # the log tail names the bad model dir


def test_modules_sharing_an_unpinned_server_run_back_to_back() -> None:
    from types import SimpleNamespace

    from vllm_pool import group_by_server

    def item(module: str, *fixtures: str) -> Any:
        return SimpleNamespace(nodeid=f"tests/{module}.py::t", fixturenames=list(fixtures))

    items = [
        item("a", "hybrid"),
        item("b"),
        item("c", "events"),
        item("d", "hybrid"),
        item("d", "x"),
        item("e"),
        item("f", "events"),
        item("g", "hybrid", "events"),
    ]
    ordered = group_by_server(items, ("hybrid", "events"))
    assert [i.nodeid[6] for i in ordered] == list("addgbcfe")
    assert sorted(map(id, ordered)) == sorted(map(id, items))  # every test kept, once
