"""Measure how many distinct cached prefixes vLLM keeps for the tiny hybrid (Gated DeltaNet)
model in a pool of N blocks, to compare with the planner's counting rule (planner/prefixes.py).

Usage: .venv/bin/python scripts/measure_hybrid_prefixes.py [BLOCKS]   (default 64)

Starts vLLM CPU on .cache/tiny-models/hybrid (build it first: the test suite does) with
--num-gpu-blocks-override BLOCKS, then for m = 2, 4, ...: empties the prefix cache, admits m
random 522-token prompts (two full 256-token blocks each, re-sent until a send hits: align mode),
and probes them newest first; stops at the first m that does not all stay cached.
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
from residency.launcher import free_port, vllm_env  # noqa: E402

BLOCK = 256  # the tiny hybrid model's attention block on an AVX512-BF16 CPU (test_harness.py)
PROMPT_TOKENS = 2 * BLOCK + 10


def main(blocks: int) -> None:
    """Start the server, run the rounds, stop the server."""
    port = free_port()
    log = (REPO_ROOT / ".cache" / f"measure-hybrid-{blocks}.log").open("w")
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(REPO_ROOT / ".cache" / "tiny-models" / "hybrid"),
            "--served-model-name", "tiny", "--port", str(port), "--max-model-len", "2048",
            "--enforce-eager", "--enable-prefix-caching", "--enable-prompt-tokens-details",
            "--num-gpu-blocks-override", str(blocks),
        ],
        env=vllm_env(1, dev_mode=True),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, proc)
        with httpx.Client(base_url=url, timeout=120) as client:
            _rounds(client)
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


def _rounds(client: httpx.Client) -> None:
    rng = random.Random(0)
    expected = (PROMPT_TOKENS - 1) // BLOCK * BLOCK
    for count in range(2, 41, 2):
        while not client.post("/reset_prefix_cache").is_success:
            time.sleep(0.2)
        prompts = [[rng.randrange(10, 7000) for _ in range(PROMPT_TOKENS)] for _ in range(count)]
        for ids in prompts:
            for _ in range(5):  # align mode may admit a prefix on a later sighting
                if _cached(client, ids) >= expected:
                    break
        hits = [_cached(client, ids) >= expected for ids in reversed(prompts)]
        print(f"{count} prefixes admitted: {sum(hits)} still cached together", flush=True)
        if not all(hits):
            return


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 64)
