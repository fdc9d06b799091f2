"""Build a residency plan: score sections from the log, choose the resident set under the budget,
render and tokenize the prefix, and describe it all in a `ResidencyPlan`.

Strategies (the planner and the baselines `residency eval coverage` compares it with):
planner (knapsack on p(s)), frequency (most-asked first), density (most evidence per token first,
no log), random (seeded), cag (corpus order, truncated at the first section that does not fit),
rag (nothing resident).
"""

from __future__ import annotations

import datetime as dt
import random
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field

from planner import InfeasiblePlanError
from planner.selection import Candidate, select_resident
from residency.corpus.model import Section
from residency.errors import ConfigError
from residency.index import Index
from residency.planning.plan_model import (
    CapacitySnapshot,
    Coverage,
    LogSummary,
    PrefixInfo,
    ResidencyPlan,
    ResidentItem,
)
from residency.planning.prefix import (
    RenderedPrefix,
    finalize_prefix,
    render_prefix,
    render_section,
)
from residency.planning.scoring import (
    DEFAULT_DEPTH,
    DEFAULT_PRIOR_WEIGHT,
    SectionScore,
    attribute_queries,
    score_sections,
)
from residency.planning.settings import Strategy
from residency.query_log import LogEntry
from residency.tokenizer import ModelTokenizer


@dataclass(frozen=True)
class PlanOptions:
    """Everything besides the index, log and capacity that shapes a plan."""

    strategy: Strategy = "planner"
    pins: tuple[str, ...] = ()
    excludes: tuple[str, ...] = ()
    instructions: str | None = None  # None: the answer policy in the corpus's language
    depth: int = DEFAULT_DEPTH
    prior_weight: float = DEFAULT_PRIOR_WEIGHT
    seed: int = 0
    log_summary: LogSummary = field(
        default_factory=lambda: LogSummary(path=None, entries=0, total_count=0, skipped=0)
    )


@dataclass(frozen=True, slots=True)
class PlanItem:
    """A section (or a part of one) that may become resident, with its cost and value."""

    id: str
    section: Section
    chunk_ids: tuple[str, ...]
    text: str  # the section's text or the part's slice
    part: int | None
    tokens: int
    score: SectionScore
    value: float


def log_mass(
    index: Index, entries: Sequence[LogEntry], depth: int = DEFAULT_DEPTH
) -> dict[str, float]:
    """Attributed query mass per section id (hybrid retrieval over the whole corpus; the
    questions embedded in one batch through the query-vector cache)."""
    from residency.index.query_vectors import log_query_vectors  # numpy, faiss: when run

    vectors = log_query_vectors(index, (e.query for e in entries))

    def search(query: str, k: int) -> list[str]:
        return [h.section_id for h in index.search_all(query, k, vectors.get(query))["hybrid"]]

    return attribute_queries(entries, search, depth)


def check_ids(index: Index, ids: Sequence[str], flag: str) -> None:
    unknown = [i for i in ids if not index.has_section(i)]
    if unknown:
        shown = ", ".join(unknown[:10]) + (" ..." if len(unknown) > 10 else "")
        raise ConfigError(f"{flag}: unknown section id(s): {shown} (see sections.jsonl)")


def render_item(item: PlanItem) -> Section:
    if item.part is None:
        return item.section
    title = f"{item.section.title} (part {item.part})".strip()
    return item.section.model_copy(update={"id": item.id, "title": title, "text": item.text})


def plan_items(
    index: Index,
    scores: Mapping[str, SectionScore],
    encoder: ModelTokenizer,
    max_item_tokens: int,
) -> list[PlanItem]:
    """One item per section; sections over `max_item_tokens` split at chunk boundaries."""
    items: list[PlanItem] = []
    for section in index.sections:
        score = scores[section.id]
        cost = encoder.count(render_section(section)) + 1
        chunks = index.chunks_of(section.id)
        if cost <= max_item_tokens or len(chunks) < 2:
            items.append(
                PlanItem(
                    section.id,
                    section,
                    tuple(c.id for c in chunks),
                    section.text,
                    None,
                    cost,
                    score,
                    score.probability,
                )
            )
            continue
        per_part = max(1, len(chunks) * max_item_tokens // (2 * cost))
        groups = [chunks[i : i + per_part] for i in range(0, len(chunks), per_part)]
        for n, group in enumerate(groups, start=1):
            text = section.text[group[0].start_char : group[-1].end_char]
            draft = PlanItem(
                f"{section.id}::part{n}",
                section,
                tuple(c.id for c in group),
                text,
                n,
                0,
                score,
                0.0,
            )
            tokens = encoder.count(render_section(render_item(draft))) + 1
            share = score.probability * len(text) / max(len(section.text), 1)
            items.append(
                PlanItem(draft.id, section, draft.chunk_ids, text, n, tokens, score, share)
            )
    return items


def _fill(order: Sequence[PlanItem], room: int, stop_at_first_miss: bool) -> list[PlanItem]:
    chosen, used = [], 0
    for item in order:
        if used + item.tokens <= room:
            chosen.append(item)
            used += item.tokens
        elif stop_at_first_miss:
            break
    return chosen


def _choose(
    items: Sequence[PlanItem], room: int, options: PlanOptions
) -> tuple[list[PlanItem], str, float]:
    pinned = [i for i in items if i.section.id in options.pins]
    free = [
        i
        for i in items
        if i.section.id not in options.pins and i.section.id not in options.excludes
    ]
    pinned_tokens = sum(i.tokens for i in pinned)
    if options.strategy == "planner":
        selection = select_resident(
            [
                Candidate(i.id, i.tokens, i.value, pinned=i.section.id in options.pins)
                for i in pinned + free
            ],
            room,
        )
        keep = set(selection.resident_ids)
        chosen = [i for i in items if i.id in keep]
        return chosen, selection.method, selection.optimality_gap_bound
    if pinned_tokens > room:
        select_resident([Candidate(i.id, i.tokens, i.value, pinned=True) for i in pinned], room)
    rest = room - pinned_tokens
    orderings: dict[str, Callable[[], list[PlanItem]]] = {
        "frequency": lambda: sorted(free, key=lambda i: (-i.score.mass, i.section.order)),
        "density": lambda: sorted(free, key=lambda i: (i.tokens, i.section.order)),
        "random": lambda: random.Random(options.seed).sample(free, len(free)),
        "cag": lambda: list(free),
        "rag": lambda: [],
    }
    chosen = _fill(orderings[options.strategy](), rest, options.strategy == "cag")
    return pinned + chosen, options.strategy, 0.0


def canonical_order(items: Sequence[PlanItem], pins: Collection[str]) -> list[PlanItem]:
    """Pinned sections first, then corpus order, parts in order: how a prefix lists its items."""
    return sorted(items, key=lambda i: (i.section.id not in pins, i.section.order, i.part or 0))


def render_items(
    chosen: Sequence[PlanItem],
    pins: set[str],
    instructions: str,
    index: Index,
    encoder: ModelTokenizer,
    align: int | None,
    budget: int,
    lead: Sequence[PlanItem] = (),
) -> tuple[list[PlanItem], RenderedPrefix]:
    """Render `chosen` in canonical order after `lead` (the shared head, in its own order, never
    dropped); drop the least dense free item while over budget."""
    chosen = list(chosen)
    while True:
        ordered = list(lead) + canonical_order(chosen, pins)
        text = render_prefix(instructions, [render_item(i) for i in ordered], index.language)
        rendered = finalize_prefix(text, encoder, align)
        if rendered.token_count <= budget or not ordered:
            return ordered, rendered
        # Token counts of parts do not add up exactly (BPE): drop the least dense free item.
        droppable = [i for i in chosen if i.section.id not in pins]
        if not droppable:
            raise InfeasiblePlanError(
                f"pinned sections render to {rendered.token_count} tokens, over the budget of "
                f"{budget}; unpin some (--pin) or raise the budget"
            )
        worst = min(droppable, key=lambda i: i.value / i.tokens)
        chosen = [i for i in chosen if i is not worst]


def resident_item(item: PlanItem, pins: set[str]) -> ResidentItem:
    """The plan.json record of one chosen item."""
    return ResidentItem(
        id=item.id,
        section_id=item.section.id,
        chunk_ids=item.chunk_ids,
        tokens=item.tokens,
        probability=min(item.value, 1.0),
        frequency=item.score.frequency,
        density=item.value / max(item.tokens, 1),
        pinned=item.section.id in pins,
    )


def prefix_info(rendered: RenderedPrefix, encoder: ModelTokenizer) -> PrefixInfo:
    """The plan.json record of a rendered prefix."""
    return PrefixInfo(
        text=rendered.text,
        token_count=rendered.token_count,
        hash=rendered.prefix_hash,
        hash_of="token_ids" if rendered.hash_of == "token_ids" else "text",
        tokenizer=encoder.name,
        pad_tokens=rendered.pad_tokens,
        aligned_to=rendered.aligned_to,
    )


def section_scores(
    index: Index, mass: Mapping[str, float], options: PlanOptions
) -> dict[str, SectionScore]:
    """p(s) and frequency of every section, by id."""
    scored = score_sections(
        [(s.id, max(s.token_count, 1)) for s in index.sections], dict(mass), options.prior_weight
    )
    return {s.section_id: s for s in scored}


def build_plan(
    index: Index,
    mass: Mapping[str, float],
    capacity: CapacitySnapshot,
    encoder: ModelTokenizer,
    options: PlanOptions,
) -> ResidencyPlan:
    """Choose and render the resident prefix for one strategy."""
    check_ids(index, options.pins, "--pin")
    check_ids(index, options.excludes, "--exclude")
    budget = capacity.resident_budget_tokens
    align = capacity.block_size if capacity.is_hybrid else None
    language = index.language
    instructions = (
        options.instructions if options.instructions is not None else language.instructions
    )
    fixed = encoder.count(render_prefix(instructions, [], language))
    room = budget - fixed - ((align - 1) if align else 0)
    if room <= 0:
        raise InfeasiblePlanError(
            f"the resident budget of {budget} tokens does not even hold the instructions "
            f"({fixed} tokens{' plus block padding' if align else ''}); raise the budget "
            "(--max-model-len, --reserve-*, --gpu-memory-utilization)"
        )
    items = plan_items(index, section_scores(index, mass, options), encoder, room)
    chosen, method, gap = _choose(items, room, options)
    pins = set(options.pins)
    ordered, rendered = render_items(chosen, pins, instructions, index, encoder, align, budget)
    resident_sections = {i.section.id for i in ordered}
    whole = {i.section.id for i in ordered if i.part is None}
    return ResidencyPlan(
        created_at=dt.datetime.now(dt.UTC),
        strategy=options.strategy,
        index_dir=str(index.directory.resolve()),
        corpus_hash=index.manifest.corpus_hash,
        capacity=capacity,
        log=options.log_summary,
        selection_method=method,
        optimality_gap_bound=gap,
        resident=tuple(resident_item(i, pins) for i in ordered),
        long_tail_section_ids=tuple(s.id for s in index.sections if s.id not in whole),
        prefix=prefix_info(rendered, encoder),
        coverage=Coverage(
            resident_share=min(sum(i.value for i in ordered), 1.0),
            resident_sections=len(resident_sections),
            total_sections=len(index.sections),
            budget_used=rendered.token_count / budget,
        ),
    )
