"""Several resident prefixes in one KV cache: each within the context window, all together within
the KV cache minus the headroom that concurrent requests' own tokens need.

    window        = max_model_len - per-request reserve          (one prefix + its request)
    headroom      = concurrency x round_up(per-request reserve, block)
    prefix i      : tokens_i <= window
    all prefixes  : sum_i round_up(tokens_i, block) <= kv_cache_tokens - headroom

Worked example (the RTX 4070 host of the README, Qwen3.5-4B FP8): kv_cache_tokens 132,021,
block 528, window 32,768 - 3,392 = 29,376 -> aligned 29,040; headroom 1 x 3,696 = 3,696 leaves
128,325; four 29,040-token prefixes take 116,160, a fifth gets the 12,144 tokens left
(23 blocks: 12,165 // 528 = 23).

Counting rule: a cached prefix of L tokens is counted as round_up(L, block) tokens of
`kv_cache_tokens`. vLLM's `kv_cache_size_tokens` already divides the block pool by the number of
KV-cache groups, so this counts ceil(L / block) blocks in *every* group. That is exact for dense
models. For hybrid models in align mode it is a conservative upper bound, measured
(scripts/measure_hybrid_prefixes.py, tiny hybrid model: 1 attention + 3 Gated DeltaNet groups,
block 256, a pool of 64 blocks): 11 prefixes of 522 tokens stay cached together, where this rule
allows 64 // (3 x 4) = 5. That fits floor(L / block) blocks per attention group plus one state
block per GDN group (2 + 3 = 5 blocks each). The planner keeps the conservative rule until the
per-group count is wired into the capacity snapshot.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.errors import InfeasiblePlanError
from planner.units import round_up

COUNTING_RULE = (
    "each prefix counted as whole blocks in every KV-cache group (exact for dense models; "
    "for hybrid models in align mode a conservative bound: measured, a GDN group holds one "
    "state block per cached prefix)"
)


@dataclass(frozen=True, slots=True)
class PrefixBudgets:
    """Token budgets of N prefixes and what they leave free."""

    budgets_tokens: tuple[int, ...]  # one per prefix, the first ones a full window
    kv_cache_tokens: int
    window_tokens: int
    headroom_tokens: int  # KV tokens the requests' own tokens need (--concurrency)

    @property
    def resident_kv_tokens(self) -> int:
        """Upper bound of what the prefixes hold (the budgets, whole blocks each)."""
        return sum(self.budgets_tokens)


def max_prefixes(kv_cache_tokens: int, window_tokens: int, headroom_tokens: int) -> int:
    """How many prefixes of at most one window fit beside the headroom (the last may be short)."""
    room = kv_cache_tokens - headroom_tokens
    if room <= 0 or window_tokens <= 0:
        return 0
    return -(-room // window_tokens)


def split_budgets(
    count: int,
    *,
    kv_cache_tokens: int,
    window_tokens: int,
    headroom_tokens: int,
    block_size: int,
) -> PrefixBudgets:
    """`count` prefix budgets: full windows (whole blocks) while the KV room lasts, the rest last.

    `window_tokens` is the single-prefix budget (already aligned for hybrid models). Raises
    `InfeasiblePlanError` when the KV cache minus the headroom cannot give every prefix a block.
    """
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    room = kv_cache_tokens - headroom_tokens
    budgets: list[int] = []
    for _ in range(count):
        budget = min(window_tokens, room // block_size * block_size)
        if budget < block_size:
            most = max_prefixes(kv_cache_tokens, window_tokens, headroom_tokens)
            raise InfeasiblePlanError(
                f"--prefixes {count}: {kv_cache_tokens:,} KV-cache tokens minus "
                f"{headroom_tokens:,} kept for concurrent requests hold at most {most} "
                f"prefix(es) of up to {window_tokens:,} tokens; lower --prefixes or "
                "--concurrency, or raise the KV cache (--gpu-memory-utilization)"
            )
        budgets.append(budget)
        room -= round_up(budget, block_size)
    return PrefixBudgets(tuple(budgets), kv_cache_tokens, window_tokens, headroom_tokens)


def concurrency_left(
    kv_cache_tokens: int, resident_kv_tokens: int, per_request_tokens: int, block_size: int
) -> int:
    """Requests whose own tokens (whole blocks each) fit beside the resident prefixes."""
    per_request = max(round_up(per_request_tokens, block_size), block_size)
    return max(kv_cache_tokens - resident_kv_tokens, 0) // per_request
