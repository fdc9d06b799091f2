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
    check_ids,
    prefix_info,
    render_items,
    resident_item,
)
from residency.planning.grouping import Packing, Pair, pack
from residency.planning.plan_model import (
    CapacitySnapshot,
    Coverage,
    PlanPrefix,
    PrefixArithmetic,
    ResidencyPlan,
    single_prefix,
)
from residency.planning.prefix import RenderedPrefix
from residency.planning.settings import MAX_PREFIXES
from residency.planning.shared_head import (
    SHARED_HEAD_SHARE,
    PrefixLayout,
    common_leading_tokens,
    lay_out,
)
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


def default_shared_tokens(capacity: CapacitySnapshot) -> int:
    """The shared head's size when --shared-tokens is not given: two thirds of the window,
    none for hybrid models (their blocks are counted in one shared pool, not shared yet)."""
    if capacity.is_hybrid:
        return 0
    return int(_window(capacity) * SHARED_HEAD_SHARE)


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
    window = prefix_budgets(capacity, 1).window_tokens
    target = default_shared_tokens(capacity) if shared_tokens is None else shared_tokens
    layout = lay_out(index, mass, capacity, encoder, options, window, target)
    if prefixes is None:
        prefixes = _best_count(layout, capacity, affinity)
        if prefixes == 1:
            return _single(build_plan(index, mass, capacity, encoder, options), capacity, auto)
    budgets = prefix_budgets(capacity, prefixes, layout.shared)
    rooms = [b - layout.head_tokens for b in budgets.budgets_tokens]
    if min(rooms) <= 0:
        raise InfeasiblePlanError(
            f"--prefixes {prefixes}: the last prefix's budget of {budgets.budgets_tokens[-1]} "
            "tokens does not hold the instructions and the shared head "
            f"({layout.head_tokens} tokens); lower --prefixes or --shared-tokens"
        )
    packing = _pack(layout.branch_items, rooms, affinity, layout.branch_pins)
    rendered, shared = _render(layout, packing, budgets, index, encoder, capacity.block_size)
    plan_prefixes = [
        single_prefix(
            tuple(resident_item(i, layout.pins) for i in ordered),
            prefix_info(text, encoder),
            sum(i.value for i in ordered),
            f"p{n}",
        )
        for n, (ordered, text) in enumerate(rendered)
    ]
    head_ids = layout.head_ids
    total = layout.head_value + sum(
        i.value for ordered, _ in rendered for i in ordered if i.id not in head_ids
    )
    plan = _plan(index, capacity, options, plan_prefixes, total, budgets, prefixes)
    return _with_prefixes(plan, plan_prefixes, capacity, auto, shared)


def _best_count(
    layout: PrefixLayout, capacity: CapacitySnapshot, affinity: Mapping[Pair, float]
) -> int:
    """The count of prefixes with the best expected coverage (a tie keeps fewer)."""
    most = max_prefix_count(capacity, layout.shared)
    best = (-1.0, 1)
    for count in range(1, min(max(most, 1), MAX_PREFIXES) + 1):
        try:
            budgets = prefix_budgets(capacity, count, layout.shared)
        except InfeasiblePlanError:
            break
        if count == 1:  # one prefix: the single-prefix plan (no head)
            one = [b - layout.overhead_tokens for b in budgets.budgets_tokens]
            packed = _pack(layout.items, one, affinity, layout.pins)
            best = (packed.value, 1) if min(one) > 0 else best
            continue
        rooms = [b - layout.head_tokens for b in budgets.budgets_tokens]
        if min(rooms) <= 0:
            break
        branches = _pack(layout.branch_items, rooms, affinity, layout.branch_pins)
        value = layout.head_value + branches.value
        if value > best[0] + 1e-9:  # a tie keeps fewer prefixes
            best = (value, count)
    return best[1]


Rendered = list[tuple[list[PlanItem], RenderedPrefix]]


def _render(
    layout: PrefixLayout,
    packing: Packing,
    budgets: PrefixBudgets,
    index: Index,
    encoder: ModelTokenizer,
    block: int,
) -> tuple[Rendered, int]:
    """Each bin rendered after the head, empty ones dropped, the most valuable first; with the
    KV tokens they share (checked against the text: 0 where there is no head)."""
    by_id = {i.id: i for i in [*layout.items, *layout.branch_items]}
    rendered: Rendered = []
    for bin_ids, budget in zip(packing.bins, budgets.budgets_tokens, strict=True):
        chosen = [by_id[i] for i in bin_ids]
        ordered, text = render_items(
            chosen,
            layout.branch_pins,
            layout.instructions,
            index,
            encoder,
            layout.align,
            budget,
            lead=layout.head,
        )
        rendered.append((ordered, text))
    # A prefix left empty (everything fit in fewer) holds nothing worth warming: dropped.
    head = layout.head
    rendered = [r for r in rendered if len(r[0]) > len(head)] or rendered[:1]
    rendered.sort(key=lambda r: -sum(i.value for i in r[0]))
    if not (head and len(rendered) > 1):
        return rendered, 0
    shared = layout.shared
    common = common_leading_tokens([text.text for _, text in rendered], encoder)
    if common // block * block < shared:  # the seam margin should make this impossible
        raise InfeasiblePlanError(
            f"the prefixes share {common} leading tokens, fewer than the {shared} planned; "
            "plan with --shared-tokens 0"
        )
    return rendered, shared


def _plan(
    index: Index,
    capacity: CapacitySnapshot,
    options: PlanOptions,
    plan_prefixes: list[PlanPrefix],
    total: float,
    budgets: PrefixBudgets,
    prefixes: int,
) -> ResidencyPlan:
    """The plan of these prefixes, its first prefix as the plan's own (prefixes listed later)."""
    # The head's items are in every prefix; the plan lists each item once.
    resident = tuple({r.id: r for p in plan_prefixes for r in p.resident}.values())
    whole = {r.section_id for r in resident if r.id == r.section_id}
    return ResidencyPlan.model_validate(
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
            prefix=plan_prefixes[0].prefix,
            coverage=Coverage(
                resident_share=min(total, 1.0),
                resident_sections=len({r.section_id for r in resident}),
                total_sections=len(index.sections),
                budget_used=sum(p.tokens for p in plan_prefixes) / sum(budgets.budgets_tokens),
            ),
        )
    )


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
