"""Planner-vs-vLLM agreement checks shared by the tiny-model and the real-model tests: the real
CLI predicts a running server's block size, blocks and KV-cache tokens twice (from the server's
own `vllm:cache_config_info`, and offline from config.json and the same flags), and both must
equal what vLLM reports and logs."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vllm_server import VllmServer

KV_LOG = re.compile(r"KV cache size: ([\d,]+) tokens")
BLOCK_LOG = re.compile(r"Setting attention block size to (\d+) tokens")
PADDING_LOG = re.compile(r"Padding mamba page size by ([\d.]+)%")


def plan_json(*args: str) -> dict[str, Any]:
    """`residency plan ... --capacity-only --json` through the real CLI, parsed."""
    out = subprocess.run(
        [sys.executable, "-m", "residency", "plan", *args, "--capacity-only", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    report: dict[str, Any] = json.loads(out.stdout)
    return report


def plan_offline(model_dir: Path, max_model_len: int, kv_gib: int, *flags: str) -> dict[str, Any]:
    """The planner's prediction from config.json, the KV bytes and vLLM flags (no server)."""
    return plan_json(
        "--model",
        str(model_dir),
        "--kv-cache-memory-bytes",
        str(kv_gib << 30),
        "--max-model-len",
        str(max_model_len),
        "--platform",
        "cpu",
        *flags,
    )


def assert_planner_agrees(
    server: VllmServer,
    model_dir: Path,
    max_model_len: int,
    kv_gib: int,
    server_args: Sequence[str] = (),
    parallel_args: Sequence[str] = (),
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Both predictions equal the server's numbers and its log line; returns the reports
    (through the server, offline). `parallel_args` (--tensor-parallel-size / --pipeline-
    parallel-size) go to both predictions: vLLM's metrics do not say how it is split."""
    report = plan_json("--server", server.base_url, "--platform", "cpu", *parallel_args)
    vllm = report["server"]
    assert vllm["max_model_len"] == max_model_len
    served = (vllm["block_size"], vllm["num_blocks"], vllm["kv_cache_tokens"])
    assert (
        vllm["predicted_block_size"],
        vllm["predicted_num_blocks"],
        vllm["predicted_kv_cache_tokens"],
    ) == served
    assert vllm["agrees"] is True
    logged = KV_LOG.findall(server.log_text())
    assert logged, "vLLM did not log its KV cache size"
    assert int(logged[-1].replace(",", "")) == report["kv_cache_tokens"]
    assert report["kv_cache_memory_bytes"] == kv_gib << 30

    # Planned before any server exists: config.json and the same vLLM flags only.
    offline = plan_offline(model_dir, max_model_len, kv_gib, *server_args, *parallel_args)
    assert (offline["block_size"], offline["num_blocks"], offline["kv_cache_tokens"]) == served
    return report, offline
