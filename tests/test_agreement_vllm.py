"""The capacity planner agrees with the real vLLM CPU server, exactly.

For each tiny configuration a real server is started; `residency plan --server URL --platform cpu
--json` (the real CLI) reads vLLM's own `vllm:cache_config_info` and predicts block size, number
of blocks and KV-cache tokens from the model's config.json and the server's KV bytes. All three
must equal vLLM's numbers, and the token count must equal the "KV cache size: N tokens" log line.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import CACHE_DIR
from vllm_server import VllmServerFactory

from residency.tiny_model import DENSE_SPEC, HYBRID_SPEC, TinyModelSpec, build_tiny_model

pytestmark = pytest.mark.vllm

# (id, model spec, extra server args, max_model_len, VLLM_CPU_KVCACHE_SPACE GiB)
CONFIGS: list[tuple[str, TinyModelSpec, tuple[str, ...], int, int]] = [
    ("dense-gqa", DENSE_SPEC, (), 32768, 1),
    ("dense-mqa", DENSE_SPEC.model_copy(update={"num_key_value_heads": 1}), (), 32768, 1),
    (
        "dense-head128",
        DENSE_SPEC.model_copy(update={"head_dim": 128, "hidden_size": 512}),
        (),
        32768,
        1,
    ),
    ("dense-6-layers", DENSE_SPEC.model_copy(update={"num_hidden_layers": 6}), (), 32768, 1),
    ("dense-fp8-kv", DENSE_SPEC, ("--kv-cache-dtype", "fp8"), 32768, 1),
    # A length that is not a multiple of the block: a request's last block is never full.
    ("dense-block64-len20000", DENSE_SPEC, ("--block-size", "64"), 20000, 2),
    ("hybrid-gdn-align", HYBRID_SPEC, ("--enable-prefix-caching",), 32768, 1),
    ("hybrid-gdn-no-prefix-cache", HYBRID_SPEC, ("--no-enable-prefix-caching",), 32768, 1),
    ("hybrid-gdn-fp8-kv", HYBRID_SPEC, ("--kv-cache-dtype", "fp8"), 32768, 1),
]

_KV_LOG = re.compile(r"KV cache size: ([\d,]+) tokens")


@pytest.mark.parametrize(
    ("spec", "server_args", "max_model_len", "kv_gib"),
    [pytest.param(*c[1:], id=c[0]) for c in CONFIGS],
)
def test_planner_matches_vllm_cpu_server(
    vllm_server_factory: VllmServerFactory,
    tiny_tokenizer_dir: Path,
    request: pytest.FixtureRequest,
    spec: TinyModelSpec,
    server_args: tuple[str, ...],
    max_model_len: int,
    kv_gib: int,
) -> None:
    name = request.node.callspec.id
    model_dir = build_tiny_model(spec, CACHE_DIR / f"agreement-{name}", tiny_tokenizer_dir)
    server = vllm_server_factory(
        model_dir,
        extra_args=("--enforce-eager", *server_args),
        max_model_len=max_model_len,
        kv_cache_space_gib=kv_gib,
        name=name,
    )
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "residency",
            "plan",
            "--server",
            server.base_url,
            "--platform",
            "cpu",
            "--capacity-only",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    vllm = report["server"]
    assert vllm["max_model_len"] == max_model_len
    assert (
        vllm["predicted_block_size"],
        vllm["predicted_num_blocks"],
        vllm["predicted_kv_cache_tokens"],
    ) == (vllm["block_size"], vllm["num_blocks"], vllm["kv_cache_tokens"])
    assert vllm["agrees"] is True
    logged = _KV_LOG.findall(server.log_text())
    assert logged, "vLLM did not log its KV cache size"
    assert int(logged[-1].replace(",", "")) == report["kv_cache_tokens"]
    assert report["kv_cache_memory_bytes"] == kv_gib << 30
