"""What a re-warm sends: each planned prefix's shared prompt as an upstream tokenizes it (the
token ids warm prefilled), and the completions body carrying them with blocks reported
(`kv_cache_report_mode` full: vLLM publishes the blocks a request found cached)."""

from __future__ import annotations

import orjson

from residency.keep.upstream import KeptUpstream
from residency.planning.plan_model import ResidencyPlan
from residency.vllm_client import VllmClient
from residency.warm.verify import shared_prefix_ids

REPORT_FULL = {"kv_cache_report_mode": "full"}


def rewarm_body(model: str | None, prompts: list[tuple[int, ...]]) -> bytes:
    """Warm prompts as token ids, one output token each, blocks reported."""
    body = {
        "model": model,
        "prompt": [list(ids) for ids in prompts] if len(prompts) > 1 else list(prompts[0]),
        "max_tokens": 1,
        "temperature": 0,
        "vllm_xargs": REPORT_FULL,
    }
    return orjson.dumps(body)


def prefix_prompts(
    plan: ResidencyPlan, up: KeptUpstream, api_key: str | None
) -> dict[str, tuple[int, ...]]:
    """Each prefix's shared prompt on `up`: what warm prefilled, what a re-warm sends."""
    assert up.model is not None
    with VllmClient(up.url, timeout_s=60.0, api_key=api_key) as client:
        return {
            p.id: tuple(shared_prefix_ids(client, up.model, p.prefix.text))
            for p in plan.all_prefixes()
        }
