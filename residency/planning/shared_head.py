"""The shared head every prefix of a multi-prefix plan starts with (see `multi`'s docstring): which
items it holds, its size in tokens and KV blocks, and the items left to the prefixes' branches."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from planner.selection import Candidate, select_resident
from residency.errors import ConfigError
from residency.index import Index
from residency.planning.build import (
    PlanItem,
    PlanOptions,
    canonical_order,
    plan_items,
    render_item,
    section_scores,
)
from residency.planning.plan_model import CapacitySnapshot
from residency.planning.prefix import render_prefix
from residency.tokenizer import ModelTokenizer

# The default shared head: this share of the window (measured, see multi's docstring and
# docs/plan.md: on JSQuAD heads of 0, 4K ... 26K tokens of a 29K window were tried; 20K gave the
# best mean over seeds 0-4 and the same on seeds 7-11).
SHARED_HEAD_SHARE = 2 / 3
# Tokens kept free at the seam between the head and a prefix's own sections: the blank line that
# joins them may tokenize into the head's last token.
SEAM_TOKENS = 2


@dataclass(frozen=True, slots=True)
class PrefixLayout:
    """What every prefix of a plan is built from: the items, the shared head, the branches'."""

    instructions: str
    align: int | None  # hybrid models: prefixes padded to whole blocks
    overhead_tokens: int  # the instructions alone, plus the alignment pad
    items: list[PlanItem]
    pins: set[str]
    head: list[PlanItem]
    head_tokens: int  # the instructions and the head, with the seam margin
    shared: int  # KV tokens of the head every prefix reuses
    branch_items: list[PlanItem]
    branch_pins: set[str]

    @property
    def head_ids(self) -> set[str]:
        """The ids of the head's items."""
        return {i.id for i in self.head}

    @property
    def head_value(self) -> float:
        """The expected coverage the head holds."""
        return sum(i.value for i in self.head)


def choose_head(items: Sequence[PlanItem], pins: set[str], room: int) -> list[PlanItem]:
    """The shared head: the knapsack's best items for `room` tokens (pins always in), in
    canonical order."""
    if room <= 0 and not pins:
        return []
    candidates = [Candidate(i.id, i.tokens, i.value, pinned=i.section.id in pins) for i in items]
    keep = set(select_resident(candidates, max(room, 0)).resident_ids)
    chosen = [i for i in items if i.id in keep]
    return canonical_order(chosen, pins)


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


def lay_out(
    index: Index,
    mass: Mapping[str, float],
    capacity: CapacitySnapshot,
    encoder: ModelTokenizer,
    options: PlanOptions,
    window: int,
    target: int,
) -> PrefixLayout:
    """The items of a plan of prefixes of `window` tokens, the head of about `target` tokens
    (0: none) and what is left for the branches."""
    align = capacity.block_size if capacity.is_hybrid else None
    instructions = (
        options.instructions if options.instructions is not None else index.language.instructions
    )
    fixed = encoder.count(render_prefix(instructions, [], index.language))
    overhead = fixed + ((align - 1) if align else 0)
    scores = section_scores(index, mass, options)
    items = [
        i
        for i in plan_items(index, scores, encoder, window - overhead)
        if i.section.id not in options.excludes
    ]
    pins = set(options.pins)
    if capacity.is_hybrid and target:
        raise ConfigError(
            f"--shared-tokens {target}: a hybrid model's prefixes share no head yet (each is "
            "counted whole in its block pool); leave --shared-tokens out or give 0"
        )
    pinned = sum(i.tokens for i in items if i.section.id in pins)
    room = max(min(target, window) - overhead, pinned if target > 0 else 0)
    head = choose_head(items, pins, room) if target > 0 else []
    head_ids = {i.id for i in head}
    head_tokens = overhead
    if head:
        lang = index.language
        head_text = render_prefix(instructions, [render_item(i) for i in head], lang)
        head_tokens = encoder.count(head_text) + SEAM_TOKENS  # dense only: no alignment pad
    branch_items = [i for i in items if i.id not in head_ids]
    if head and window - head_tokens > 0:  # sections split to fit a prefix's own room
        in_head = {i.section.id for i in head}
        branch_items = [
            i
            for i in plan_items(index, scores, encoder, window - head_tokens)
            if i.section.id not in in_head and i.section.id not in options.excludes
        ]
    shared = shared_kv_tokens(head_tokens, capacity.block_size) if head else 0
    branch_pins: set[str] = set() if head else pins
    return PrefixLayout(
        instructions,
        align,
        overhead,
        items,
        pins,
        head,
        head_tokens,
        shared,
        branch_items,
        branch_pins,
    )
