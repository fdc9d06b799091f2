"""Measure how many distinct cached prefixes vLLM keeps for the tiny hybrid (Gated DeltaNet)
model in a pool of N blocks, beside the planner's block-pool count (planner/prefixes.py).

Usage: .venv/bin/python scripts/measure_hybrid_prefixes.py [BLOCKS [PREFIX_BLOCKS [CHUNK]]]
       (defaults 64, 2, 2048: 512-token prefixes, --max-num-batched-tokens 2048)

Starts vLLM CPU on .cache/tiny-models/hybrid (build it first: the test suite does) with
--num-gpu-blocks-override BLOCKS, then for m = 1, 2, ...: empties the prefix cache, admits m
random prompts of PREFIX_BLOCKS x 256 + 10 tokens (re-sent until a send hits), and probes them
newest first; stops at the first m that does not all stay cached.
tests/test_prefixes_hybrid_vllm.py holds the planner to the same measurement.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from pathlib import Path

import httpx

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
from planner.prefixes import HybridPool, pool_headroom_blocks, pool_prefixes  # noqa: E402
from residency.launcher import free_port, vllm_env  # noqa: E402

BLOCK = 256  # the tiny hybrid model's attention block on an AVX512-BF16 CPU (test_harness.py)
SUFFIX = 10


def main(blocks: int, prefix_blocks: int, chunk: int) -> None:
    """Start the server, run the rounds, stop the server."""
    port = free_port()
    log = (REPO_ROOT / ".cache" / f"measure-hybrid-{blocks}.log").open("w")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(REPO_ROOT / ".cache" / "tiny-models" / "hybrid"),
            "--served-model-name",
            "tiny",
            "--port",
            str(port),
            "--max-model-len",
            "2048",
            "--enforce-eager",
            "--enable-prefix-caching",
            "--enable-prompt-tokens-details",
            "--num-gpu-blocks-override",
            str(blocks),
            "--max-num-batched-tokens",
            str(chunk),
        ],
        env=vllm_env(1, dev_mode=True),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, proc)
        pool = HybridPool(blocks, BLOCK, 1, 3, chunk)
        prefix = prefix_blocks * BLOCK
        planned = pool_prefixes(pool, prefix, pool_headroom_blocks(pool, 1, SUFFIX))
        print(f"planner: {planned} prefixes of {prefix} tokens fit {blocks} blocks", flush=True)
        with httpx.Client(base_url=url, timeout=120) as client:
            _rounds(client, prefix)
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(60)


def _wait_healthy(url: str, proc: subprocess.Popen[bytes]) -> None:
    for _ in range(300):
        if proc.poll() is not None:
            raise SystemExit("vLLM exited while starting (see .cache/measure-hybrid-*.log)")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise SystemExit("vLLM did not answer /health in 300 s")


def _cached(client: httpx.Client, ids: list[int]) -> int:
    body = {"model": "tiny", "prompt": ids, "max_tokens": 1}
    usage = client.post("/v1/completions", json=body).json()["usage"]
    return int(usage["prompt_tokens_details"]["cached_tokens"])


def _rounds(client: httpx.Client, expected: int) -> None:
    rng = random.Random(0)
    for count in range(1, 41):
        while not client.post("/reset_prefix_cache").is_success:
            time.sleep(0.2)
        size = expected + SUFFIX
        prompts = [[rng.randrange(10, 7000) for _ in range(size)] for _ in range(count)]
        for ids in prompts:
            for _ in range(5):  # align mode may admit a prefix on a later sighting
                if _cached(client, ids) >= expected:
                    break
        hits = [_cached(client, ids) >= expected for ids in reversed(prompts)]
        print(f"{count} prefixes admitted: {sum(hits)} still cached together", flush=True)
        if not all(hits):
            return


if __name__ == "__main__":
    args = [int(a) for a in sys.argv[1:]] + [64, 2, 2048][len(sys.argv) - 1 :]
    main(*args[:3])
