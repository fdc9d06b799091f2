"""--max-resident-share: the resident prefixes take at most that share of the KV cache; the
rest stays free, on top of (never below) the --concurrency reserve. Hand-computed: 12,288 KV
tokens in 128-token blocks, 3,392 reserved tokens per request (256 + 2,048 + 1,024 + 64)."""

from __future__ import annotations

import pytest

from planner import Reserves
from planner.budget import compute_resident_budget


@pytest.mark.parametrize(
    ("share", "kv_limit"),
    [
        (1.0, 12_288 - 3_456),  # the concurrency reserve binds: round_up(3,392, 128)
        (0.9, 12_288 - 3_456),  # 0.9 x 12,288 -> 86 blocks: the reserve still binds
        (0.75, 12_288 - 3_456),  # 72 blocks = 9,216 > 8,832: likewise
        (0.7, 8_576),  # 8,601.6 -> 67 blocks
        (0.5, 6_144),
        (0.25, 3_072),
    ],
    ids=lambda v: str(v),
)
def test_the_share_caps_the_kv_limit(share: float, kv_limit: int) -> None:
    budget = compute_resident_budget(
        max_model_len=32_768,
        kv_cache_tokens=12_288,
        block_size=128,
        reserves=Reserves(max_resident_share=share),
        align_to_blocks=False,
    )
    assert budget.kv_limit_tokens == kv_limit
    assert budget.concurrency_reserve_tokens == 12_288 - kv_limit
    assert budget.resident_budget_tokens == kv_limit


def test_the_default_keeps_the_planner_rule() -> None:
    assert Reserves().max_resident_share == 1.0
