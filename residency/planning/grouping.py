"""Which resident sections sit together in one prefix: sections asked together, and sections
close in the index, share a prefix, so the router finds a question's evidence in one of them.

Affinity between two sections (symmetric, in query units):
- co-asked: each logged query with count c puts c x w_a x w_b on every pair of its top-`depth`
  sections (w = the 1/rank^2 attribution weights, normalised as in `scoring.attribute_queries`);
- closeness: each section's first chunk, searched with BM25, puts `CLOSENESS_WEIGHT` on the pair
  (section, each other section among its top hits), as if a quarter of a query had asked both.

Packing: the parts of one section are merged first, then the chosen sections of one document
(file order, each to the next), then sections along the strongest affinities — each merge only
while the cluster fits one prefix. Documents first because the router picks a prefix by its
best-ranked resident chunk, and a question's top hits usually come from the right document even
when they miss the right section: split across prefixes, a document's sections sit in another
prefix than the one its question is sent to. Measured on JSQuAD valid (BM25, Zipf 1.1, a modelled
RTX 4070 host, `residency eval coverage --squad ... --kv-cache-tokens 132021 --max-model-len 32768
--concurrency 4`), seeds 7/8/9: served coverage 0.9905/0.9775/0.9925 without the document step,
0.9925/0.9915/0.9955 with it (one prefix: 0.9915/0.9920/0.9940). Then clusters go
best-fit-decreasing into the prefixes; a cluster that fits nowhere is broken into its items;
leftover room takes unchosen items by density.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from residency.query_log import LogEntry

CLOSENESS_WEIGHT = 0.25
CLOSENESS_K = 4

Pair = tuple[str, str]


def _pair(a: str, b: str) -> Pair:
    return (a, b) if a < b else (b, a)


def co_asked(
    entries: Sequence[LogEntry], search: Callable[[str, int], Sequence[str]], depth: int
) -> dict[Pair, float]:
    """Pair affinity from logged queries' top-`depth` sections."""
    weights = [1.0 / r**2 for r in range(1, depth + 1)]
    out: dict[Pair, float] = {}
    for entry in entries:
        ids = list(dict.fromkeys(search(entry.query, depth)))[:depth]
        norm = sum(weights[: len(ids)]) or 1.0
        for (i, a), (j, b) in itertools.combinations(enumerate(ids), 2):
            key = _pair(a, b)
            w = entry.count * (weights[i] / norm) * (weights[j] / norm)
            out[key] = out.get(key, 0.0) + w
    return out


def closeness(
    first_chunks: Iterable[tuple[str, str]], search: Callable[[str, int], Sequence[str]]
) -> dict[Pair, float]:
    """Pair affinity from the index: (section id, its first chunk's text) searched for its
    nearest other sections."""
    out: dict[Pair, float] = {}
    for section_id, text in first_chunks:
        for other in search(text, CLOSENESS_K + 1):
            if other != section_id:
                key = _pair(section_id, other)
                out[key] = out.get(key, 0.0) + CLOSENESS_WEIGHT
    return out


def merge_affinity(*parts: Mapping[Pair, float]) -> dict[Pair, float]:
    """The sum of several affinity maps."""
    out: dict[Pair, float] = {}
    for part in parts:
        for key, w in part.items():
            out[key] = out.get(key, 0.0) + w
    return out


class Packable(Protocol):
    """What packing needs of an item."""

    @property
    def id(self) -> str:
        """Item id (a section, or 'section::partN')."""
        ...

    @property
    def tokens(self) -> int:
        """Cost in the rendered prefix."""
        ...

    @property
    def value(self) -> float:
        """p(s): expected share of questions."""
        ...


T = TypeVar("T", bound=Packable)


@dataclass(frozen=True, slots=True)
class Packing:
    """Items per prefix (in the order of `rooms`) and their summed value."""

    bins: tuple[tuple[str, ...], ...]
    value: float


def pack(
    chosen: Sequence[T],
    spare: Sequence[T],
    rooms: Sequence[int],
    affinity: Mapping[Pair, float],
    section_of: Callable[[str], str],
    first: Sequence[T] = (),
    document_of: Callable[[str], str] | None = None,
) -> Packing:
    """Group `chosen` into prefixes of `rooms` tokens along `affinity`; fill leftover room from
    `spare` (best density first). `first` (pinned items) goes into the first prefix.
    `document_of` (item id -> its document) keeps a document's chosen sections together first."""
    free = list(rooms)
    bins: list[list[T]] = [[] for _ in rooms]
    for item in first:
        bins[0].append(item)
        free[0] -= item.tokens
    limit = max(free) if free else 0
    edges = _edges(chosen, affinity, section_of, document_of)
    for cluster in sorted(_clusters(chosen, edges, limit), key=lambda c: -sum(i.tokens for i in c)):
        tokens = sum(i.tokens for i in cluster)
        slot = _tightest(free, tokens)
        if slot is not None:
            bins[slot] += cluster
            free[slot] -= tokens
            continue
        for item in sorted(cluster, key=lambda i: -i.value / max(i.tokens, 1)):
            slot = _tightest(free, item.tokens)
            if slot is not None:
                bins[slot].append(item)
                free[slot] -= item.tokens
    placed = {i.id for b in bins for i in b}
    by_id = {i.id for i in chosen}
    for item in sorted(spare, key=lambda i: -i.value / max(i.tokens, 1)):
        if item.id in placed or item.id in by_id:
            continue
        slot = _tightest(free, item.tokens)
        if slot is not None:
            bins[slot].append(item)
            free[slot] -= item.tokens
            placed.add(item.id)
    value = sum(i.value for b in bins for i in b)
    return Packing(tuple(tuple(i.id for i in b) for b in bins), value)


Edge = tuple[int, float, str, str]


def _edges(
    chosen: Sequence[T],
    affinity: Mapping[Pair, float],
    section_of: Callable[[str], str],
    document_of: Callable[[str], str] | None,
) -> list[Edge]:
    """(tier, weight, a, b) in merge order: tier 0 parts of one section, tier 1 one document,
    tier 2 affinity (strongest first)."""
    by_section: dict[str, list[str]] = {}
    for item in chosen:
        by_section.setdefault(section_of(item.id), []).append(item.id)
    edges: list[Edge] = []
    for ids in by_section.values():
        edges += [(0, 0.0, a, b) for a, b in itertools.pairwise(ids)]
    if document_of is not None:
        by_document: dict[str, list[str]] = {}
        for ids in by_section.values():
            by_document.setdefault(document_of(ids[0]), []).append(ids[0])
        for ids in by_document.values():
            edges += [(1, 0.0, a, b) for a, b in itertools.pairwise(ids)]
    for (sa, sb), w in affinity.items():
        if sa in by_section and sb in by_section:
            edges.append((2, -w, by_section[sa][0], by_section[sb][0]))
    edges.sort(key=lambda e: (e[0], e[1]))
    return edges


def _clusters(chosen: Sequence[T], edges: Sequence[Edge], limit: int) -> list[list[T]]:
    """Union-find along `edges`, never growing a cluster past `limit` tokens."""
    parent = {i.id: i.id for i in chosen}
    size = {i.id: i.tokens for i in chosen}

    def root(x: str) -> str:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for _, _, a, b in edges:
        ra, rb = root(a), root(b)
        if ra != rb and size[ra] + size[rb] <= limit:
            parent[rb] = ra
            size[ra] += size[rb]
    clusters: dict[str, list[T]] = {}
    for item in chosen:
        clusters.setdefault(root(item.id), []).append(item)
    return list(clusters.values())


def _tightest(free: Sequence[int], tokens: int) -> int | None:
    """The prefix with the least free room that still holds `tokens` (None: none does)."""
    fits = [n for n, room in enumerate(free) if room >= tokens]
    return min(fits, key=lambda n: free[n]) if fits else None
