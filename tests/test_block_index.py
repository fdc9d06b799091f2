"""The block index (residency/keep/block_index.py) on hand-written event sequences: how a
prefix's chain is found by its tokens, when it counts as evicted and whole again, a shared head,
a hybrid model's state group, and what is not residency (LoRA / salted blocks, offload tiers).
The same logic on a real engine's events is in test_kv_events_vllm.py."""

from __future__ import annotations

from residency.keep.block_index import BlockIndex, Chain
from residency.vllm_client.kv_events import (
    AllBlocksCleared,
    BlockHash,
    BlockRemoved,
    BlockStored,
)

B = 4  # block size


def stored(
    hashes: list[BlockHash],
    parent: BlockHash | None,
    tokens: range | list[int],
    group: int = 0,
    medium: str | None = "GPU",
    keyed: bool = False,
) -> BlockStored:
    return BlockStored(tuple(hashes), parent, tuple(tokens), B, group, medium, keyed)


def removed(hashes: list[BlockHash], group: int | None = 0) -> BlockRemoved:
    return BlockRemoved(tuple(hashes), group, "GPU")


def test_cacheable_blocks_stop_before_the_last_token() -> None:
    # 13 tokens, block 4: vLLM recomputes token 13, so (13 - 1) // 4 = 3 blocks.
    assert Chain("p", tuple(range(13))).blocks(B) == [(0, 1, 2, 3), (4, 5, 6, 7), (8, 9, 10, 11)]
    assert len(Chain("p", tuple(range(12))).blocks(B)) == 2


def test_a_chain_is_learned_from_stores_then_evicted_then_restored() -> None:
    # Evicted: a removal that takes a resident block of the prefix (each one, whole or not:
    # a re-warm in flight may have refilled it in the meantime).
    index = BlockIndex()
    index.set_prefixes([Chain("p0", tuple(range(13)))])
    # A request's first two blocks, then (next step) its third, parent = the second.
    change = index.apply([stored(["a", "b"], None, range(8))])
    assert (index.resident_blocks("p0"), index.total_blocks("p0")) == (2, 3)
    assert change.restored == ()
    assert not index.whole("p0")
    change = index.apply([stored(["c"], "b", range(8, 12))])
    assert change.restored == ("p0",)
    assert index.whole("p0")
    assert index.learned("p0")
    # Another sequence's blocks with the same tokens under another parent are not the prefix.
    index.apply([stored(["x"], "other", range(4))])
    assert index.resident_blocks("p0") == 3
    change = index.apply([removed(["b"])])
    assert change.evicted == ("p0",)
    assert index.resident_blocks("p0") == 1  # only the leading run counts for a hit
    change = index.apply([removed(["c"])])
    assert change.evicted == ("p0",)  # another resident block lost: hit again
    change = index.apply([removed(["x"])])
    assert change.evicted == ()  # not the prefix's
    change = index.apply([stored(["b", "c"], "a", range(4, 12))])
    assert change.restored == ("p0",)
    assert index.whole("p0")


def test_blocks_cached_before_tracking_are_learned_from_a_full_report() -> None:
    index = BlockIndex()
    index.apply([stored(["a", "b", "c"], None, range(12))])  # cached before the plan was known
    index.set_prefixes([Chain("p0", tuple(range(13)))])
    assert index.resident_blocks("p0") == 0
    assert not index.learned("p0")
    # kv_cache_report_mode "full": vLLM reports the blocks a request found cached, from block 0.
    change = index.apply([stored(["a", "b", "c"], None, range(12))])
    assert change.restored == ("p0",)
    assert index.learned("p0")


def test_two_prefixes_sharing_a_head_share_its_blocks() -> None:
    index = BlockIndex()
    head = list(range(8))
    index.set_prefixes(
        [Chain("p0", (*head, 100, 101, 102, 103, 9)), Chain("p1", (*head, 200, 201, 202, 203, 9))]
    )
    index.apply([stored(["h0", "h1", "x"], None, [*head, 100, 101, 102, 103])])
    index.apply([stored(["y"], "h1", [200, 201, 202, 203])])
    assert index.whole("p0")
    assert index.whole("p1")
    change = index.apply([removed(["h1"])])
    assert sorted(change.evicted) == ["p0", "p1"]
    change = index.apply([removed(["y"])])
    assert change.evicted == ("p1",)
    change = index.apply([removed(["h0"])])
    assert sorted(change.evicted) == ["p0", "p1"]
    change = index.apply([removed(["h0"])])
    assert change.evicted == ()  # gone already


def test_a_cleared_cache_evicts_every_whole_prefix() -> None:
    index = BlockIndex()
    index.set_prefixes([Chain("p0", tuple(range(9))), Chain("p1", tuple(range(50, 59)))])
    index.apply([stored(["a", "b"], None, range(8))])
    change = index.apply([AllBlocksCleared()])
    assert change.cleared
    assert change.evicted == ("p0",)
    assert index.resident_blocks("p0") == 0
    assert index.learned("p0")


def test_a_state_group_checkpoint_counts_but_does_not_teach_the_chain() -> None:
    # Hybrid (align mode): the state group stores only the last block before the prompt's end,
    # so its event holds 1 hash for 8 tokens; removing it loses the prefix's hits.
    index = BlockIndex()
    index.set_prefixes([Chain("p0", tuple(range(9)))])
    index.apply(
        [stored(["a", "b"], None, range(8), group=0), stored(["b"], None, range(8), group=1)]
    )
    assert index.whole("p0")
    change = index.apply([removed(["b"], group=1)])
    assert change.evicted == ("p0",)
    assert index.whole("p0")  # the attention blocks are still there


def test_salted_lora_and_offloaded_blocks_are_not_residency() -> None:
    index = BlockIndex()
    index.set_prefixes([Chain("p0", tuple(range(9)))])
    index.apply([stored(["a", "b"], None, range(8), keyed=True)])
    index.apply([stored(["a", "b"], None, range(8), medium="CPU")])
    assert index.resident_blocks("p0") == 0
    index.apply([stored(["a", "b"], None, range(8))])
    index.apply([BlockRemoved(("b",), 0, "CPU")])  # an offload tier dropping its copy
    assert index.whole("p0")


def test_a_removal_without_group_removes_the_hash_from_every_group() -> None:
    index = BlockIndex()
    index.set_prefixes([Chain("p0", tuple(range(5)))])
    index.apply([stored(["a"], None, range(4))])
    assert index.apply([removed(["a"], group=None)]).evicted == ("p0",)


def test_reset_forgets_hashes_a_restarted_engine_may_not_reproduce() -> None:
    index = BlockIndex()
    index.set_prefixes([Chain("p0", tuple(range(5)))])
    index.apply([stored(["a"], None, range(4))])
    index.reset()
    assert not index.learned("p0")
    assert index.resident_blocks("p0") == 0
    index.apply([stored(["a2"], None, range(4))])  # new seed, new hash, same tokens
    assert index.whole("p0")


def test_copies_are_counted_and_a_block_stays_resident_until_its_last_copy_goes() -> None:
    # vLLM sends BlockRemoved per physical copy (vllm#55092): two stores, one removal -> held.
    index = BlockIndex()
    index.set_prefixes([Chain("p", tuple(range(9)))])
    index.apply([stored([1, 2], None, range(8))])
    index.apply([stored([1, 2], None, range(8))])
    assert index.copies(1) == 2
    assert index.apply([removed([2])]).evicted == ()
    assert index.whole("p")
    assert index.apply([removed([2])]).evicted == ("p",)
    assert index.resident_blocks("p") == 1


def test_a_report_mode_store_of_a_held_block_is_not_another_copy() -> None:
    index = BlockIndex()
    index.set_prefixes([Chain("p", tuple(range(9)))])
    index.apply([stored([1, 2], None, range(8))])
    index.reporting = 1  # the router's probe is out: its found-cached blocks come back as stores
    index.apply([stored([1, 2], None, range(8))])
    index.reporting = 0
    assert index.copies(2) == 1
    assert index.apply([removed([2])]).evicted == ("p",)
    # a wrong belief (a removal that was not the last copy) is corrected by the next report
    index.reporting = 1
    index.apply([stored([1, 2], None, range(8))])
    assert index.whole("p")


def test_the_hash_set_is_bounded_and_keeps_the_planned_chains() -> None:
    index = BlockIndex(max_hashes=100)
    index.set_prefixes([Chain("p", tuple(range(9)))])
    index.apply([stored([1, 2], None, range(8))])
    flood = [stored([10_000 + i], 999_999, range(4)) for i in range(5_000)]
    index.apply(flood)
    assert index.known_hashes == 100
    assert index.whole("p")  # the plan's blocks were not shed
    assert index.copies(10_000) == 0  # the oldest went first
    assert index.copies(14_999) == 1
