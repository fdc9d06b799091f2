"""Several resident prefixes in one KV cache: each within the context window, all together within
the KV cache minus the headroom that concurrent requests' own tokens need.

    window        = max_model_len - per-request reserve          (one prefix + its request)
    headroom      = concurrency x round_up(per-request reserve, block)
    prefix i      : tokens_i <= window
    all prefixes  : sum_i round_up(tokens_i, block) - (N - 1) x shared <= kv_cache_tokens - headroom

`shared` is the KV every prefix has in common: the whole blocks of a shared head (the same
leading tokens in every prefix). vLLM's prefix cache is a chain of block hashes, each block's
hash covering every token before it (vllm/v1/core/kv_cache_utils.py `hash_block_tokens`), so
prefixes that start with the same blocks reuse one cached copy of them
(`BlockPool.get_cached_block`): the head costs its blocks once, each prefix only its own rest.

Worked example of the token rule (the KV tokens of the README's RTX 4070 host): kv_cache_tokens
132,021, block 528, window 32,768 - 3,392 = 29,376 -> aligned 29,040; headroom 1 x 3,696 = 3,696
leaves 128,325; four 29,040-token prefixes take 116,160, a fifth gets the 12,144 tokens left
(23 blocks: 12,165 // 528 = 23). That host's model (Qwen3.5-4B) is hybrid, so the planner
counts it in blocks instead (below): 278 blocks, 277 usable; a request 7 + 3 = 10; a window
55 + 3 = 58; four take 232, a fifth gets 35 blocks = 32 x 528 = 16,896 tokens.

Dense models: a cached prefix of L tokens holds ceil(L / block) blocks in every group, and
`kv_cache_tokens` already spreads the pool over the groups, so the token rule above is exact.

Hybrid models (Gated DeltaNet) in vLLM's "align" prefix-caching mode: every KV-cache group draws
whole blocks from one shared pool of `num_gpu_blocks` (vllm/v1/core/kv_cache_utils.py
`get_kv_cache_config_from_groups`: one tensor per layer slot, shared by one layer of each group,
so a block id is used by one group at a time; block 0 is the null block, block_pool.py
`BlockPool.__init__`). A prefix warmed from an empty cache holds, per group (vLLM 0.32):
- attention group: ceil(L / block) blocks (single_type_kv_cache_manager.py
  `SingleTypeKVCacheManager.cache_blocks`: every full block is hashed and kept);
- GDN (Mamba) group: one state block, the state at the last block boundary before the prompt
  end (L for a block-aligned prefix followed by its question). The scheduler ends prefill
  chunks on block boundaries and there (sched/scheduler.py `_mamba_block_aligned_split`),
  `MambaManager.allocate_new_blocks` fills the positions in between with the null block, and
  with --prefix-cache-retention-interval 0 (vLLM's default) `MambaManager.reachable_block_mask`
  lets `cache_blocks` hash only the replay boundary (kv_cache_coordinator.py
  `replay_boundaries`: num_prompt_tokens - 1, block-aligned down); the states at earlier chunk
  ends are freed unhashed (`remove_skipped_blocks`). A hit needs just that one state
  (`MambaManager.find_longest_cache_hit`). With another retention interval, earlier chunk
  ends can keep states too: counted then as one per prefill chunk (an upper bound).
A running request needs ceil(r / block) attention blocks and one running state block per GDN
group (`MambaManager.get_num_blocks_to_allocate`, align branch). Freed blocks without a hash are
reused before any cached one (block_pool.py `free_blocks`), so prefixes fit together exactly
while sum_i blocks(L_i) + concurrency x request blocks <= num_gpu_blocks - 1.

Measured (tests/test_prefixes_hybrid_vllm.py, scripts/measure_hybrid_prefixes.py; tiny hybrid
model: 1 attention + 3 GDN groups, block 256, --num-gpu-blocks-override 64, KV 9,362 tokens):
512-token prefixes + 10: 2 + 3 = 5 blocks each, a request 1 + 3 = 4, (63 - 4) // 5 = 11 fit
and vLLM keeps 11 (the token rule: (9,362 - 256) // 512 = 17); 1,024-token prefixes prefilled
in 512-token chunks: 4 + 3 = 7 blocks, 8 fit, vLLM keeps 8 (token rule: 8).
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.errors import InfeasiblePlanError
from planner.units import cdiv, round_up

COUNTING_RULE = "each prefix counted as whole blocks in every KV-cache group (dense: exact)"
POOL_COUNTING_RULE = (
    "hybrid align mode, one shared block pool: a prefix holds ceil(L / block) blocks per "
    "attention group and one state block per Gated DeltaNet group (--prefix-cache-retention-"
    "interval 0; otherwise one per prefill chunk); a request ceil(r / block) + 1 per GDN group"
)


@dataclass(frozen=True, slots=True)
class HybridPool:
    """The block pool a hybrid model's KV-cache groups share in align mode (see the module)."""

    num_blocks: int  # vLLM num_gpu_blocks, the null block included
    block_size: int
    attention_groups: int
    state_groups: int  # Gated DeltaNet (Mamba) groups
    prefill_chunk_tokens: int  # --max-num-batched-tokens
    retention_interval: int | None = 0  # --prefix-cache-retention-interval (None: dense)

    @property
    def usable_blocks(self) -> int:
        """Blocks a request can get: all but the null block."""
        return max(self.num_blocks - 1, 0)

    def state_blocks(self, tokens: int) -> int:
        """State blocks one GDN group keeps for a prefix of `tokens`: the one at its end (retention
        0), else at most one per prefill chunk end."""
        aligned = tokens // self.block_size * self.block_size
        if self.retention_interval == 0:
            return int(aligned > 0)
        chunk = max(self.prefill_chunk_tokens // self.block_size, 1) * self.block_size
        return cdiv(aligned, chunk)

    def prefix_blocks(self, tokens: int) -> int:
        """Blocks a cached prefix of `tokens` holds over all groups."""
        attention = self.attention_groups * cdiv(tokens, self.block_size)
        return attention + self.state_groups * self.state_blocks(tokens)

    def request_blocks(self, tokens: int) -> int:
        """Blocks one running request's own `tokens` need beside its cached prefix."""
        return self.attention_groups * max(cdiv(tokens, self.block_size), 1) + self.state_groups


@dataclass(frozen=True, slots=True)
class PrefixBudgets:
    """Token budgets of N prefixes and what they leave free."""

    budgets_tokens: tuple[int, ...]  # one per prefix, the first ones a full window
    kv_cache_tokens: int
    window_tokens: int
    headroom_tokens: int  # KV tokens the requests' own tokens need (--concurrency)
    pool_blocks: tuple[int, ...] = ()  # hybrid pool: blocks per prefix (empty: token rule)
    headroom_blocks: int = 0  # hybrid pool: blocks kept for --concurrency requests
    shared_tokens: int = 0  # whole blocks every prefix starts with, cached once

    @property
    def resident_kv_tokens(self) -> int:
        """Upper bound of what the prefixes hold (the budgets, whole blocks each, the shared
        head once)."""
        return sum(self.budgets_tokens) - (len(self.budgets_tokens) - 1) * self.shared_tokens


def max_prefixes(
    kv_cache_tokens: int, window_tokens: int, headroom_tokens: int, shared_tokens: int = 0
) -> int:
    """How many prefixes of at most one window fit beside the headroom (the last may be short);
    every prefix after the first costs its window less the `shared_tokens` all of them share."""
    room = kv_cache_tokens - headroom_tokens
    if room <= 0 or window_tokens <= 0:
        return 0
    if room <= window_tokens:
        return 1
    return 1 + -(-(room - window_tokens) // max(window_tokens - shared_tokens, 1))


def split_budgets(
    count: int,
    *,
    kv_cache_tokens: int,
    window_tokens: int,
    headroom_tokens: int,
    block_size: int,
    shared_tokens: int = 0,
) -> PrefixBudgets:
    """`count` prefix budgets: full windows (whole blocks) while the KV room lasts, the rest last.

    `window_tokens` is the single-prefix budget (already aligned for hybrid models);
    `shared_tokens` (whole blocks) lead every prefix and are cached once: each prefix after the
    first costs that much less, and must hold at least one block of its own beyond them. Raises
    `InfeasiblePlanError` when the KV cache minus the headroom cannot give every prefix a block.
    """
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    if shared_tokens % block_size or shared_tokens < 0:
        raise ValueError(f"shared_tokens must be whole blocks of {block_size}, got {shared_tokens}")
    room = kv_cache_tokens - headroom_tokens
    budgets: list[int] = []
    for n in range(count):
        reused = shared_tokens if n else 0
        budget = min(window_tokens, (room + reused) // block_size * block_size)
        if budget < block_size + (shared_tokens if count > 1 else 0):
            most = max_prefixes(kv_cache_tokens, window_tokens, headroom_tokens, shared_tokens)
            raise InfeasiblePlanError(
                f"--prefixes {count}: {kv_cache_tokens:,} KV-cache tokens minus "
                f"{headroom_tokens:,} kept for concurrent requests hold at most {most} "
                f"prefix(es) of up to {window_tokens:,} tokens; lower --prefixes or "
                "--concurrency, or raise the KV cache (--gpu-memory-utilization)"
            )
        budgets.append(budget)
        room -= round_up(budget, block_size) - reused
    return PrefixBudgets(
        tuple(budgets),
        kv_cache_tokens,
        window_tokens,
        headroom_tokens,
        shared_tokens=shared_tokens if count > 1 else 0,
    )


def concurrency_left(
    kv_cache_tokens: int, resident_kv_tokens: int, per_request_tokens: int, block_size: int
) -> int:
    """Requests whose own tokens (whole blocks each) fit beside the resident prefixes."""
    per_request = max(round_up(per_request_tokens, block_size), block_size)
    return max(kv_cache_tokens - resident_kv_tokens, 0) // per_request


def pool_headroom_blocks(pool: HybridPool, concurrency: int, per_request_tokens: int) -> int:
    """Blocks `concurrency` running requests need beside the cached prefixes."""
    return concurrency * pool.request_blocks(per_request_tokens)


def pool_prefixes(pool: HybridPool, tokens: int, headroom_blocks: int) -> int:
    """How many prefixes of `tokens` each stay cached together beside the headroom."""
    room = pool.usable_blocks - headroom_blocks
    return max(room, 0) // pool.prefix_blocks(tokens) if tokens > 0 else 0


def max_pool_prefixes(pool: HybridPool, window_tokens: int, headroom_blocks: int) -> int:
    """`max_prefixes` on a hybrid pool: full windows, the last one possibly short."""
    room = pool.usable_blocks - headroom_blocks
    full = pool_prefixes(pool, window_tokens, headroom_blocks)
    rest = room - full * pool.prefix_blocks(window_tokens)
    return full + int(rest >= pool.prefix_blocks(pool.block_size))


def split_pool_budgets(
    count: int, pool: HybridPool, *, kv_cache_tokens: int, window_tokens: int, headroom_blocks: int
) -> PrefixBudgets:
    """`split_budgets` on a hybrid pool: each prefix the longest whole-block budget up to the
    window whose blocks (all groups) fit the room left."""
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    block = pool.block_size
    room = pool.usable_blocks - headroom_blocks
    budgets: list[int] = []
    blocks: list[int] = []
    for _ in range(count):
        budget = window_tokens // block * block
        while budget >= block and pool.prefix_blocks(budget) > room:
            budget -= block
        if budget < block:
            most = max_pool_prefixes(pool, window_tokens, headroom_blocks)
            raise InfeasiblePlanError(
                f"--prefixes {count}: {pool.usable_blocks:,} KV-cache blocks (hybrid pool) minus "
                f"{headroom_blocks:,} kept for concurrent requests hold at most {most} "
                f"prefix(es) of up to {window_tokens:,} tokens; lower --prefixes or "
                "--concurrency, or raise the KV cache (--gpu-memory-utilization)"
            )
        budgets.append(budget)
        blocks.append(pool.prefix_blocks(budget))
        room -= blocks[-1]
    headroom_tokens = headroom_blocks * block
    return PrefixBudgets(
        tuple(budgets),
        kv_cache_tokens,
        window_tokens,
        headroom_tokens,
        tuple(blocks),
        headroom_blocks,
    )
