"""Plan several resident prefixes: how many (the count that maximises expected coverage under
the KV headroom, or --prefixes), which sections (the knapsack over all prefixes' room), grouped
so that what is asked together sits together (`grouping`), each rendered and hashed on its own.

Every prefix starts with the same **shared head**: the instructions and the sections most worth
having in front of every question, rendered identically, so vLLM caches those blocks once
(planner/prefixes.py) and a question routed to the wrong prefix still sees them. The router picks
a prefix from a question's best-ranked hits, and on a question worded unlike anything logged the
best hits can point to another prefix than the one holding its evidence: on JSQuAD (Zipf 1.1,
BM25, modelled RTX 4070 host, seeds 0-4) one such question asked 195 times in 2,000 sent seed 2
to 0.895 coverage with disjoint prefixes, below one prefix's 0.989. A head of two thirds of the
window holds the traffic's head where every route sees it, and the rest of the KV cache holds
the long tail in small routed branches. `--shared-tokens` sets the head (0: disjoint prefixes).

`--prefixes 1` is the single-prefix plan of `build_plan`, unchanged, with its one prefix listed.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence

from planner import InfeasiblePlanError
from planner.prefixes import (
    COUNTING_RULE,
    POOL_COUNTING_RULE,
    HybridPool,
    PrefixBudgets,
    concurrency_left,
    max_pool_prefixes,
    max_prefixes,
    pool_headroom_blocks,
    split_budgets,
    split_pool_budgets,
)
from planner.selection import Candidate, select_resident
from planner.units import round_up
from residency.errors import ConfigError
from residency.index import Index
from residency.planning.build import (
    PlanItem,
    PlanOptions,
    build_plan,
    canonical_order,
    check_ids,
    plan_items,
    prefix_info,
    render_item,
    render_items,
    resident_item,
    section_scores,
)
from residency.planning.grouping import Packing, Pair, pack
from residency.planning.plan_model import (
    MAX_PREFIXES,
    CapacitySnapshot,
    Coverage,
    PlanPrefix,
    PrefixArithmetic,
    ResidencyPlan,
    single_prefix,
)
from residency.planning.prefix import RenderedPrefix, render_prefix
from residency.tokenizer import ModelTokenizer


def hybrid_pool(capacity: CapacitySnapshot) -> tuple[HybridPool, int] | None:
    """(the shared block pool, the blocks --concurrency requests need) for a hybrid model in
    align mode; None where the token rule applies."""
    bp = capacity.block_pool
    if bp is None or not capacity.is_hybrid:
        return None
    pool = HybridPool(
        bp.num_blocks,
        capacity.block_size,
        bp.attention_groups,
        bp.state_groups,
        bp.prefill_chunk_tokens,
        bp.retention_interval,
    )
    concurrency = capacity.concurrent_requests or 1
    return pool, pool_headroom_blocks(pool, concurrency, capacity.per_request_tokens or 0)


def _window(capacity: CapacitySnapshot) -> int:
    window = capacity.resident_budget_tokens
    if capacity.context_limit_tokens is not None:
        window = capacity.context_limit_tokens
        if capacity.is_hybrid:
            window = window // capacity.block_size * capacity.block_size
    return window


def max_prefix_count(capacity: CapacitySnapshot, shared: int = 0) -> int:
    """How many prefixes of at most one window fit (the last may be short)."""
    window = _window(capacity)
    pooled = hybrid_pool(capacity)
    if pooled is not None:
        return max_pool_prefixes(pooled[0], window, pooled[1])
    reserve = capacity.concurrency_reserve_tokens or 0
    return max_prefixes(capacity.kv_cache_tokens, window, reserve, shared)


def _head(items: Sequence[PlanItem], pins: set[str], room: int) -> list[PlanItem]:
    """The shared head: the knapsack's best items for `room` tokens (pins always in), in
    canonical order."""
    if room <= 0 and not pins:
        return []
    candidates = [Candidate(i.id, i.tokens, i.value, pinned=i.section.id in pins) for i in items]
    keep = set(select_resident(candidates, max(room, 0)).resident_ids)
    chosen = [i for i in items if i.id in keep]
    return canonical_order(chosen, pins)


# The default shared head: this share of the window (measured, see the module docstring and
# docs/plan.md: on JSQuAD heads of 0, 4K ... 26K tokens of a 29K window were tried; 20K gave the
# best mean over seeds 0-4 and the same on seeds 7-11).
SHARED_HEAD_SHARE = 2 / 3
# Tokens kept free at the seam between the head and a prefix's own sections: the blank line that
# joins them may tokenize into the head's last token.
SEAM_TOKENS = 2


def default_shared_tokens(capacity: CapacitySnapshot) -> int:
    """The shared head's size when --shared-tokens is not given: two thirds of the window,
    none for hybrid models (their blocks are counted in one shared pool, not shared yet)."""
    if capacity.is_hybrid:
        return 0
    return int(_window(capacity) * SHARED_HEAD_SHARE)


def shared_kv_tokens(head_tokens: int, block: int) -> int:
    """KV tokens of the head every prefix reuses: its whole blocks less one (the seam)."""
    return max(head_tokens // block - 1, 0) * block


def common_leading_tokens(texts: Sequence[str], encoder: ModelTokenizer) -> int:
    """Leading tokens every one of two or more texts shares (token ids where the tokenizer
    gives them, else the count of the common leading text less one)."""
    encoded = [encoder.encode(t) for t in texts]
    ids = [x for x in encoded if x is not None]
    if len(ids) == len(texts):
        first, n = ids[0], min(len(x) for x in ids)
        common = 0
        while common < n and all(x[common] == first[common] for x in ids):
            common += 1
        return common
    text = texts[0]
    n = min(len(t) for t in texts)
    end = next((i for i in range(n) if any(t[i] != text[i] for t in texts)), n)
    return max(encoder.count(text[:end]) - 1, 0)


def prefix_budgets(capacity: CapacitySnapshot, count: int, shared: int = 0) -> PrefixBudgets:
    """The token budgets of `count` prefixes on this capacity (`shared`: whole-block KV tokens
    every prefix starts with, cached once)."""
    block = capacity.block_size
    window = _window(capacity)
    pooled = hybrid_pool(capacity)
    if pooled is not None:
        return split_pool_budgets(
            count,
            pooled[0],
            kv_cache_tokens=capacity.kv_cache_tokens,
            window_tokens=window,
            headroom_blocks=pooled[1],
        )
    return split_budgets(
        count,
        kv_cache_tokens=capacity.kv_cache_tokens,
        window_tokens=window,
        headroom_tokens=capacity.concurrency_reserve_tokens or 0,
        block_size=block,
        shared_tokens=shared,
    )


def _pack(
    items: Sequence[PlanItem], rooms: Sequence[int], affinity: Mapping[Pair, float], pins: set[str]
) -> Packing:
    pinned = [i for i in items if i.section.id in pins]
    free = [i for i in items if i.section.id not in pins and i.tokens <= max(rooms)]
    room = sum(rooms) - sum(i.tokens for i in pinned)
    selection = select_resident([Candidate(i.id, i.tokens, i.value) for i in free], max(room, 0))
    keep = set(selection.resident_ids)
    chosen = [i for i in free if i.id in keep]
    section = {i.id: i.section.id for i in items}
    document = {i.id: i.section.file for i in items}
    return pack(chosen, free, rooms, affinity, section.__getitem__, pinned, document.__getitem__)


def build_prefix_plan(
    index: Index,
    mass: Mapping[str, float],
    affinity: Mapping[Pair, float],
    capacity: CapacitySnapshot,
    encoder: ModelTokenizer,
    options: PlanOptions,
    prefixes: int | None = None,
    shared_tokens: int | None = None,
) -> ResidencyPlan:
    """The planner's plan over `prefixes` prefixes (None: the count with the best coverage),
    each starting with a shared head of about `shared_tokens` (None: two thirds of the window;
    0: none)."""
    auto = prefixes is None
    if prefixes == 1 or options.strategy != "planner":
        if prefixes not in (None, 1):
            raise ConfigError(f"--prefixes {prefixes}: only --strategy planner plans several")
        return _single(build_plan(index, mass, capacity, encoder, options), capacity, auto)
    check_ids(index, options.pins, "--pin")
    check_ids(index, options.excludes, "--exclude")
    align = capacity.block_size if capacity.is_hybrid else None
    instructions = (
        options.instructions if options.instructions is not None else index.language.instructions
    )
    fixed = encoder.count(render_prefix(instructions, [], index.language))
    overhead = fixed + ((align - 1) if align else 0)
    window = prefix_budgets(capacity, 1).window_tokens
    scores = section_scores(index, mass, options)
    items = [
        i
        for i in plan_items(index, scores, encoder, window - overhead)
        if i.section.id not in options.excludes
    ]
    pins = set(options.pins)
    block = capacity.block_size
    target = default_shared_tokens(capacity) if shared_tokens is None else shared_tokens
    if capacity.is_hybrid and target:
        raise ConfigError(
            f"--shared-tokens {target}: a hybrid model's prefixes share no head yet (each is "
            "counted whole in its block pool); leave --shared-tokens out or give 0"
        )
    pinned = sum(i.tokens for i in items if i.section.id in pins)
    room = max(min(target, window) - overhead, pinned if target > 0 else 0)
    head = _head(items, pins, room) if target > 0 else []
    head_ids = {i.id for i in head}
    head_tokens = overhead
    if head:
        lang = index.language
        head_text = render_prefix(instructions, [render_item(i) for i in head], lang)
        head_tokens = encoder.count(head_text) + SEAM_TOKENS  # dense only: no alignment pad
    shared = shared_kv_tokens(head_tokens, block) if head else 0
    branch_items = [i for i in items if i.id not in head_ids]
    if head and window - head_tokens > 0:  # sections split to fit a prefix's own room
        in_head = {i.section.id for i in head}
        branch_items = [
            i
            for i in plan_items(index, scores, encoder, window - head_tokens)
            if i.section.id not in in_head and i.section.id not in options.excludes
        ]
    branch_pins = set() if head else pins
    head_value = sum(i.value for i in head)
    if prefixes is None:
        most = max_prefix_count(capacity, shared)
        best = (-1.0, 1)
        for count in range(1, min(max(most, 1), MAX_PREFIXES) + 1):
            try:
                budgets = prefix_budgets(capacity, count, shared)
            except InfeasiblePlanError:
                break
            if count == 1:  # one prefix: the single-prefix plan (no head)
                one = [b - overhead for b in budgets.budgets_tokens]
                best = (_pack(items, one, affinity, pins).value, 1) if min(one) > 0 else best
                continue
            rooms = [b - head_tokens for b in budgets.budgets_tokens]
            if min(rooms) <= 0:
                break
            value = head_value + _pack(branch_items, rooms, affinity, branch_pins).value
            if value > best[0] + 1e-9:  # a tie keeps fewer prefixes
                best = (value, count)
        prefixes = best[1]
        if prefixes == 1:
            return _single(build_plan(index, mass, capacity, encoder, options), capacity, auto)
    budgets = prefix_budgets(capacity, prefixes, shared)
    rooms = [b - head_tokens for b in budgets.budgets_tokens]
    if min(rooms) <= 0:
        raise InfeasiblePlanError(
            f"--prefixes {prefixes}: the last prefix's budget of {budgets.budgets_tokens[-1]} "
            f"tokens does not hold the instructions and the shared head ({head_tokens} tokens); "
            "lower --prefixes or --shared-tokens"
        )
    packing = _pack(branch_items, rooms, affinity, branch_pins)
    by_id = {i.id: i for i in [*items, *branch_items]}
    rendered: list[tuple[list[PlanItem], RenderedPrefix]] = []
    for bin_ids, budget in zip(packing.bins, budgets.budgets_tokens, strict=True):
        chosen = [by_id[i] for i in bin_ids]
        ordered, text = render_items(
            chosen, branch_pins, instructions, index, encoder, align, budget, lead=head
        )
        rendered.append((ordered, text))
    # A prefix left empty (everything fit in fewer) holds nothing worth warming: dropped.
    rendered = [r for r in rendered if len(r[0]) > len(head)] or rendered[:1]
    rendered.sort(key=lambda r: -sum(i.value for i in r[0]))
    if head and len(rendered) > 1:
        common = common_leading_tokens([text.text for _, text in rendered], encoder)
        if common // block * block < shared:  # the seam margin should make this impossible
            raise InfeasiblePlanError(
                f"the prefixes share {common} leading tokens, fewer than the {shared} planned; "
                "plan with --shared-tokens 0"
            )
    else:
        shared = 0
    total = head_value + sum(
        i.value for ordered, _ in rendered for i in ordered if i.id not in head_ids
    )
    plan_prefixes = [
        single_prefix(
            tuple(resident_item(i, pins) for i in ordered),
            prefix_info(text, encoder),
            sum(i.value for i in ordered),
            f"p{n}",
        )
        for n, (ordered, text) in enumerate(rendered)
    ]
    # The head's items are in every prefix; the plan lists each item once.
    resident = tuple({r.id: r for p in plan_prefixes for r in p.resident}.values())
    whole = {r.section_id for r in resident if r.id == r.section_id}
    first = plan_prefixes[0]
    plan = ResidencyPlan.model_validate(
        dict(
            created_at=dt.datetime.now(dt.UTC),
            strategy="planner",
            index_dir=str(index.directory.resolve()),
            corpus_hash=index.manifest.corpus_hash,
            capacity=capacity,
            log=options.log_summary,
            selection_method=f"dp+grouping ({prefixes} prefixes)",
            optimality_gap_bound=0.0,
            resident=resident,
            long_tail_section_ids=tuple(s.id for s in index.sections if s.id not in whole),
            prefix=first.prefix,
            coverage=Coverage(
                resident_share=min(total, 1.0),
                resident_sections=len({r.section_id for r in resident}),
                total_sections=len(index.sections),
                budget_used=sum(p.tokens for p in plan_prefixes) / sum(budgets.budgets_tokens),
            ),
        )
    )
    return _with_prefixes(plan, plan_prefixes, capacity, auto, shared)


def _single(plan: ResidencyPlan, capacity: CapacitySnapshot, auto: bool) -> ResidencyPlan:
    """A single-prefix plan with its one prefix listed."""
    share = plan.coverage.resident_share
    return _with_prefixes(plan, [single_prefix(plan.resident, plan.prefix, share)], capacity, auto)


def _with_prefixes(
    plan: ResidencyPlan,
    prefixes: list[PlanPrefix],
    capacity: CapacitySnapshot,
    auto: bool,
    shared: int = 0,
) -> ResidencyPlan:
    block = capacity.block_size
    resident_kv = sum(round_up(p.tokens, block) for p in prefixes) - (len(prefixes) - 1) * shared
    headroom = capacity.kv_cache_tokens - resident_kv
    per_request = capacity.per_request_tokens or 0
    left = concurrency_left(capacity.kv_cache_tokens, resident_kv, per_request, block)
    pool_fields: dict[str, int] = {}
    pooled = hybrid_pool(capacity)
    if pooled is not None:
        pool = pooled[0]
        resident_blocks = sum(pool.prefix_blocks(p.tokens) for p in prefixes)
        one = pool.request_blocks(per_request)
        left = max(pool.usable_blocks - resident_blocks, 0) // one
        pool_fields = dict(
            pool_blocks=pool.usable_blocks, resident_blocks=resident_blocks, per_request_blocks=one
        )
    arithmetic = PrefixArithmetic(
        kv_cache_tokens=capacity.kv_cache_tokens,
        window_tokens=prefix_budgets(capacity, 1).window_tokens,
        resident_kv_tokens=resident_kv,
        headroom_tokens=headroom,
        per_request_kv_tokens=max(round_up(per_request, block), block),
        concurrency_requested=capacity.concurrent_requests or 1,
        concurrency_left=left,
        prefixes_chosen_by="auto" if auto else "forced",
        counting_rule=POOL_COUNTING_RULE if pooled is not None else COUNTING_RULE,
        shared_kv_tokens=shared,
        **pool_fields,
    )
    return plan.model_copy(update={"prefixes": tuple(prefixes), "arithmetic": arithmetic})
