"""Several prefixes on a hybrid (Gated DeltaNet) model in align mode: the block-pool rule of
planner/prefixes.py, hand-computed. The real-server proof is tests/test_prefixes_hybrid_vllm.py."""

from __future__ import annotations

import pytest

from planner import InfeasiblePlanError
from planner.prefixes import (
    HybridPool,
    max_pool_prefixes,
    pool_headroom_blocks,
    pool_prefixes,
    split_pool_budgets,
)

# The tiny hybrid model (1 attention + 3 GDN groups, block 256) with --num-gpu-blocks-override 64.
TINY = HybridPool(
    num_blocks=64, block_size=256, attention_groups=1, state_groups=3, prefill_chunk_tokens=2048
)


def test_a_prefix_holds_its_attention_blocks_and_one_state_per_gdn_group() -> None:
    assert TINY.usable_blocks == 63  # block 0 is the null block
    assert TINY.prefix_blocks(512) == 2 + 3 * 1
    assert TINY.request_blocks(10) == 1 + 3  # one attention block, one running state per group
    # (63 - 4) // 5 = 11: what scripts/measure_hybrid_prefixes.py measured on vLLM CPU. The token
    # rule (KV 9,362 tokens: 64 blocks / 14 per 2,048-token request) allowed
    # (9,362 - 256) // 512 = 17.
    assert pool_prefixes(TINY, 512, pool_headroom_blocks(TINY, 1, 10)) == 11


def test_only_the_last_state_is_kept_unless_retention_is_set() -> None:
    # Default retention (0): the 512-token chunk end's state is freed unhashed; one state left.
    chunked = HybridPool(64, 256, 1, 3, prefill_chunk_tokens=512)
    assert chunked.prefix_blocks(1024) == 4 + 3 * 1
    assert pool_prefixes(chunked, 1024, 4) == 8  # (63 - 4) // 7, measured on vLLM CPU
    # Another retention interval: at most one state per chunk end (512 and 1,024).
    dense = HybridPool(64, 256, 1, 3, prefill_chunk_tokens=512, retention_interval=None)
    assert dense.state_blocks(1024) == 2
    assert pool_prefixes(dense, 1024, 4) == 5  # (63 - 4) // 10
    # A chunk smaller than a block still ends on every block boundary.
    assert HybridPool(64, 256, 1, 3, 100, retention_interval=512).state_blocks(1024) == 4
    assert TINY.state_blocks(1024) == 1
    assert TINY.state_blocks(100) == 0


def test_pool_budgets_fill_windows_then_a_short_last_one() -> None:
    # 63 - 4 = 59 blocks of room; a 1,024-token window costs 4 + 3 = 7 blocks: eight take 56,
    # and the 3 left cannot hold even one block of attention plus 3 states.
    split = split_pool_budgets(
        8, TINY, kv_cache_tokens=9_362, window_tokens=1_024, headroom_blocks=4
    )
    assert split.budgets_tokens == (1_024,) * 8
    assert split.pool_blocks == (7,) * 8
    assert max_pool_prefixes(TINY, 1_024, 4) == 8
    with pytest.raises(InfeasiblePlanError, match=r"63 KV-cache blocks .* at most 8 prefix"):
        split_pool_budgets(9, TINY, kv_cache_tokens=9_362, window_tokens=1_024, headroom_blocks=4)
    # 61 blocks of room: 5 left after eight windows, a ninth prefix of 2 blocks (2 + 3 = 5).
    last = split_pool_budgets(
        9, TINY, kv_cache_tokens=9_362, window_tokens=1_024, headroom_blocks=2
    )
    assert last.budgets_tokens == (1_024,) * 8 + (512,)
    assert max_pool_prefixes(TINY, 1_024, 2) == 9
    assert max_pool_prefixes(TINY, 1_024, 0) == 9  # 63 = 9 x 7
