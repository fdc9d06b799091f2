"""One upstream's prefix cache as vLLM's KV events describe it, and each planned prefix's block
chain in it. Pure: events in, residency out; no sockets, no clock.

A prefix's chain is found by its token ids, not by recomputing vLLM's hashes: the hash function
(`--prefix-caching-hash-algo`), its seed (`NONE_HASH`, random per process for xxhash unless
PYTHONHASHSEED is set; vllm/v1/core/kv_cache_utils.py) and the extra keys are the engine's
business, while every `BlockStored` carries the token ids of its blocks and the parent of the
first. Block i of a prefix is the stored block whose parent is block i-1's hash (None for i = 0)
and whose tokens are the prefix's tokens [i*B, (i+1)*B): e.g. a 1,000-token shared prompt with
B = 16 has (1000 - 1) // 16 = 62 cacheable blocks (vLLM always recomputes the last token).

Hybrid models keep several KV-cache groups, and a state group (Mamba, align mode) stores only
some blocks of a chain (`block_mask`), so its events hold fewer hashes than its tokens span:
those are not matched. A chain block is resident while every attention group (one whose events
map hashes onto tokens one by one) holds it; a state group that drops a block of a whole prefix
(its checkpoint) reports the prefix evicted all the same, since a hit needs every group.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from residency.vllm_client.kv_events import (
    AllBlocksCleared,
    BlockHash,
    BlockRemoved,
    BlockStored,
    KvEvent,
)

PRIMARY_MEDIA = (None, "GPU")  # the engine's own pool; CPU/disk offload tiers are not residency
# Hashes one upstream's index holds at most. The engine holds at most its KV cache's blocks
# (vLLM's num_gpu_blocks: 8,192 for 128K tokens of 16-token blocks); a publisher that claims
# more is flooding. Past this the oldest hash not in a planned chain is forgotten (some 170 B
# each: 200,000 are about 35 MB).
MAX_HASHES = 200_000
APPLY_CHUNK_HASHES = 4096  # hashes applied per hold of the lock


@dataclass(slots=True)
class Chain:
    """A planned prefix's token ids and the hashes of its blocks, as far as they are known."""

    prefix_id: str
    token_ids: tuple[int, ...]
    block_size: int | None = None
    hashes: list[BlockHash | None] = field(default_factory=list)

    def blocks(self, block_size: int) -> list[tuple[int, ...]]:
        """The cacheable blocks: full blocks before the last token."""
        n = max(len(self.token_ids) - 1, 0) // block_size
        return [self.token_ids[i * block_size : (i + 1) * block_size] for i in range(n)]


@dataclass(frozen=True, slots=True)
class Change:
    """What one batch did to the planned prefixes: those that lost a resident block (evicted:
    a BlockRemoved that hit them, or a cleared cache), those whole again, and whether the
    cache was cleared."""

    evicted: tuple[str, ...] = ()
    restored: tuple[str, ...] = ()
    cleared: bool = False


class BlockIndex:
    """Which blocks the engine holds (group -> hash -> copies) and where the planned prefixes
    stand. Thread-safe: batches are applied in a worker thread, a chunk of hashes at a time
    under the lock, while the event loop reads residency between chunks."""

    def __init__(self, max_hashes: int = MAX_HASHES) -> None:
        self._lock = threading.RLock()
        self.max_hashes = max_hashes
        self._counts: dict[int, dict[BlockHash, int]] = {}  # group -> hash -> copies held
        self._size = 0  # entries in _counts, all groups
        self._full_groups: set[int] = set()  # groups whose stores map hashes onto tokens
        self._hit: set[str] = set()  # prefixes that lost a resident block in this batch
        self._chains: dict[str, Chain] = {}
        self._owners: dict[BlockHash, set[str]] = {}  # chain hash -> prefix ids
        self._waiting: dict[BlockHash | None, list[tuple[str, int]]] = {}
        self._block_size: int | None = None
        self._blocks: dict[str, list[tuple[int, ...]]] = {}
        self._whole: dict[str, bool] = {}
        # While the router's own report-mode request (a probe, a re-warm) is out, a store of a
        # hash already held is its blocks found cached, reported: not one more copy.
        self.reporting = 0
        self.stored_events = 0
        self.removed_events = 0
        self.shed_hashes = 0  # unrelated hashes forgotten to stay within max_hashes

    def set_prefixes(self, chains: Iterable[Chain]) -> None:
        """Track these prefixes (replacing any earlier set); what is cached stays known."""
        with self._lock:
            self._chains = {c.prefix_id: c for c in chains}
            self._owners = {}
            self._blocks = {}
            self._whole = {}
            self._rebuild_waiting()

    def reset(self) -> None:
        """Forget the cache and the learned hashes (a restarted engine may hash anew)."""
        with self._lock:
            self._counts.clear()
            self._size = 0
            for chain in self._chains.values():
                chain.hashes = []
            self._owners = {}
            self._whole = {}
            self._rebuild_waiting()

    @property
    def prefix_ids(self) -> list[str]:
        """The tracked prefixes."""
        with self._lock:
            return list(self._chains)

    @property
    def known_hashes(self) -> int:
        """Hashes held in the index (all groups): at most max_hashes."""
        return self._size

    def copies(self, h: BlockHash, group: int = 0) -> int:
        """Copies of the block the engine holds in `group` (stores minus removals)."""
        with self._lock:
            return self._counts.get(group, {}).get(h, 0)

    def learned(self, prefix_id: str) -> bool:
        """Every block hash of the prefix is known."""
        with self._lock:
            chain = self._chains[prefix_id]
            total = self.total_blocks(prefix_id)
            return total is not None and len(chain.hashes) == total and None not in chain.hashes

    def total_blocks(self, prefix_id: str) -> int | None:
        """Its cacheable blocks (None until a block size is seen)."""
        with self._lock:
            if self._block_size is None:
                return None
            return len(self._blocks_of(prefix_id))

    def resident_blocks(self, prefix_id: str) -> int:
        """Leading blocks of the prefix the engine holds in every group that stored them (a
        hit can use only a leading run)."""
        with self._lock:
            n = 0
            for h in self._chains[prefix_id].hashes:
                if h is None or not self._held(h):
                    break
                n += 1
            return n

    def uncached_tokens(self, prefix_id: str, length: int) -> int:
        """Of the prefix's `length` prompt tokens, those past its resident blocks (what a
        request with it would prefill now)."""
        with self._lock:
            return max(length - self.resident_blocks(prefix_id) * (self._block_size or 0), 0)

    def whole(self, prefix_id: str) -> bool:
        """Every block of the prefix is resident."""
        with self._lock:
            total = self.total_blocks(prefix_id)
            return bool(total) and self.resident_blocks(prefix_id) == total

    def apply(self, events: Sequence[KvEvent]) -> Change:
        """Apply one batch; the prefixes it evicted or made whole again. The lock is let go
        every APPLY_CHUNK_HASHES hashes, so readers wait for a chunk, never for a batch."""
        with self._lock:
            before = {p: self._whole.get(p, False) for p in self._chains}
            self._hit = set()
        cleared = False
        done = 0
        self._lock.acquire()
        try:
            for event in events:
                if done >= APPLY_CHUNK_HASHES:
                    self._lock.release()
                    done = 0
                    self._lock.acquire()
                if isinstance(event, BlockStored):
                    self._stored(event)
                    done += len(event.block_hashes)
                elif isinstance(event, BlockRemoved):
                    self._removed(event)
                    done += len(event.block_hashes)
                elif isinstance(event, AllBlocksCleared):
                    self._hit.update(p for p in self._chains if self.resident_blocks(p))
                    self._counts.clear()
                    self._size = 0
                    cleared = True
            restored: list[str] = []
            for p in self._chains:
                now = self.whole(p)
                self._whole[p] = now
                if now and not before.get(p, False) and p not in self._hit:
                    restored.append(p)
            evicted = tuple(p for p in self._chains if p in self._hit)
        finally:
            self._lock.release()
        return Change(evicted, tuple(restored), cleared)

    def _held(self, h: BlockHash) -> bool:
        groups = {g for g, counts in self._counts.items() if counts.get(h, 0) > 0}
        return bool(groups) and groups >= self._full_groups

    def _add(self, group: int, h: BlockHash) -> None:
        counts = self._counts.setdefault(group, {})
        n = counts.get(h)
        if n is None:
            counts[h] = 1
            self._size += 1
            if self._size > self.max_hashes:
                self._shed(counts)
        elif not self.reporting:
            counts[h] = n + 1

    def _shed(self, counts: dict[BlockHash, int]) -> None:
        """Forget the oldest unrelated hash of the group (insertion order); the planned
        chains' hashes are kept (moved to the young end)."""
        for _ in range(len(self._owners) + 1):
            oldest = next(iter(counts))
            n = counts.pop(oldest)
            if oldest in self._owners:
                counts[oldest] = n
                continue
            self._size -= 1
            self.shed_hashes += 1
            return

    def _stored(self, event: BlockStored) -> None:
        if event.medium not in PRIMARY_MEDIA or event.keyed:
            return
        self.stored_events += 1
        group = event.group_idx if event.group_idx is not None else 0
        for h in event.block_hashes:
            self._add(group, h)
        bs = event.block_size
        if bs <= 0 or len(event.token_ids) != len(event.block_hashes) * bs:
            return  # a masked (state) group: its hashes do not map onto its tokens one by one
        self._full_groups.add(group)
        if self._block_size is None:
            self._block_size = bs
            self._rebuild_waiting()
        if bs != self._block_size:
            return
        parent = event.parent_block_hash
        for j, h in enumerate(event.block_hashes):
            waiting = self._waiting.get(parent)
            if waiting:
                tokens = event.token_ids[j * bs : (j + 1) * bs]
                for prefix_id, i in list(waiting):
                    if self._blocks_of(prefix_id)[i] == tokens:
                        self._learn(prefix_id, i, h)
            parent = h

    def _removed(self, event: BlockRemoved) -> None:
        """One copy of each block gone (vLLM sends a removal per physical copy: a hash stays
        resident while another copy is held)."""
        if event.medium not in PRIMARY_MEDIA:
            return
        self.removed_events += 1
        groups = list(self._counts) if event.group_idx is None else [event.group_idx]
        for h in event.block_hashes:
            was_held = self._held(h) if h in self._owners else False
            state_gone = False
            for g in groups:
                counts = self._counts.get(g)
                n = counts.get(h) if counts is not None else None
                if counts is None or n is None:
                    continue
                if n > 1:
                    counts[h] = n - 1
                    continue
                del counts[h]
                self._size -= 1
                state_gone = state_gone or g not in self._full_groups
            if h in self._owners and ((was_held and not self._held(h)) or state_gone):
                # a resident block of a prefix, or a state group's checkpoint of one
                self._hit.update(self._owners[h])

    def _learn(self, prefix_id: str, i: int, h: BlockHash) -> None:
        chain = self._chains[prefix_id]
        while len(chain.hashes) <= i:
            chain.hashes.append(None)
        if chain.hashes[i] == h:
            return
        chain.hashes[i] = h
        self._owners.setdefault(h, set()).add(prefix_id)
        if i + 1 < len(self._blocks_of(prefix_id)):
            waiting = self._waiting.setdefault(h, [])
            if (prefix_id, i + 1) not in waiting:
                waiting.append((prefix_id, i + 1))

    def _blocks_of(self, prefix_id: str) -> list[tuple[int, ...]]:
        if prefix_id not in self._blocks:
            assert self._block_size is not None
            self._blocks[prefix_id] = self._chains[prefix_id].blocks(self._block_size)
        return self._blocks[prefix_id]

    def _rebuild_waiting(self) -> None:
        """Which (prefix, block) each parent hash may be followed by: block 0 of every prefix
        after None, block i+1 after a learned block i."""
        self._waiting = {}
        if self._block_size is None:
            return
        for p, chain in self._chains.items():
            if self._blocks_of(p):
                self._waiting.setdefault(None, []).append((p, 0))
            for i, h in enumerate(chain.hashes):
                if h is not None:
                    self._owners.setdefault(h, set()).add(p)
                    if i + 1 < len(self._blocks_of(p)):
                        self._waiting.setdefault(h, []).append((p, i + 1))
