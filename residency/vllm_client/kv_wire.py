"""vLLM's KV-cache events on the wire: the msgpack batch a publisher sends, decoded defensively
into frozen dataclasses. Pure: bytes in, events out (or `KvEventsError` naming what is wrong).

vLLM 0.32 (`vllm/distributed/kv_events.py`) encodes a `KVEventBatch` with msgspec as
`[ts, [event, ...], data_parallel_rank]`, each event a map tagged by its class name:

    {"type": "BlockStored", "block_hashes": [h, ...], "parent_block_hash": h | None,
     "token_ids": [...], "block_size": 16, "lora_id": None, "medium": "GPU", "group_idx": 0}
    {"type": "BlockRemoved", "block_hashes": [h, ...], "medium": "GPU", "group_idx": 0}
    {"type": "AllBlocksCleared"}

A hash is 32 sha256 bytes (an int with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES). Fields left at
their defaults are omitted (`omit_defaults`), and older layouts encoded an event as an array
(tag first, then the fields in order): both are read. The payload comes from the network: every
field's type is checked here, so that nothing malformed reaches the block index.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

BlockHash = bytes | int
# Field order of the array layout (vLLM's example subscriber declares events array_like).
_STORED_FIELDS = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id")
_REMOVED_FIELDS = ("block_hashes", "medium")


class KvEventsError(Exception):
    """A payload that is not a KV event batch; `kind` names the fault for counting (msgpack,
    layout, ts, event, field, frames, seq, size)."""

    def __init__(self, message: str, kind: str = "batch") -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True, slots=True)
class BlockStored:
    """Full blocks newly cached (or, with kv_cache_report_mode "full", found cached): the
    hashes in chain order, the first block's parent, and the token ids they hold."""

    block_hashes: tuple[BlockHash, ...]
    parent_block_hash: BlockHash | None
    token_ids: tuple[int, ...]
    block_size: int
    group_idx: int | None
    medium: str | None
    keyed: bool  # LoRA or extra keys in the hash: its blocks are not the tokens alone


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    """Blocks whose hashes left the prefix cache (evicted or replaced)."""

    block_hashes: tuple[BlockHash, ...]
    group_idx: int | None
    medium: str | None


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    """The whole prefix cache was reset (`/reset_prefix_cache`, sleep)."""


KvEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True, slots=True)
class EventBatch:
    """One published batch: its sequence number, the engine's timestamp and its events."""

    seq: int
    ts: float
    events: tuple[KvEvent, ...]


def decode_batch(seq: int, payload: bytes) -> EventBatch:
    """The batch in one payload; `KvEventsError` (naming what is wrong: its `kind`) when it is
    not one. Every field is checked for its type: the payload comes from the network, and a
    value of the wrong type must be refused here, not fail later in the block index."""
    import msgspec

    try:
        raw = msgspec.msgpack.decode(payload)
    except msgspec.DecodeError as exc:
        raise KvEventsError(f"KV event batch {seq}: not msgpack ({exc})", "msgpack") from None
    except (RecursionError, MemoryError, ValueError) as exc:  # nesting, sizes msgspec refuses
        raise KvEventsError(f"KV event batch {seq}: {type(exc).__name__}", "msgpack") from None
    if not isinstance(raw, list | tuple) or len(raw) < 2 or not isinstance(raw[1], list):
        raise KvEventsError(f"KV event batch {seq}: expected [ts, [events...], ...]", "layout")
    ts = raw[0]
    if not _is_int(ts) and not isinstance(ts, float):
        raise KvEventsError(f"KV event batch {seq}: timestamp {ts!r:.40} is not a number", "ts")
    events = tuple(e for e in (_event(x) for x in raw[1]) if e is not None)
    return EventBatch(seq, float(ts), events)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _event(raw: Any) -> KvEvent | None:
    """One event from its map (or array) form; an unknown kind is skipped (None)."""
    if isinstance(raw, list | tuple) and raw and isinstance(raw[0], str):
        kind = raw[0]
        names = _STORED_FIELDS if kind == "BlockStored" else _REMOVED_FIELDS
        fields: dict[Any, Any] = dict(zip(names, raw[1:], strict=False))
    elif isinstance(raw, dict) and isinstance(raw.get("type"), str):
        kind, fields = raw["type"], raw
    else:
        raise KvEventsError(f"KV event {raw!r:.80}: neither a typed map nor an array", "event")
    if kind == "AllBlocksCleared":
        return AllBlocksCleared()
    if kind not in ("BlockStored", "BlockRemoved"):
        return None
    hashes = _hashes(fields.get("block_hashes"))
    group = _optional(fields, "group_idx", int)
    medium = _optional(fields, "medium", str)
    if kind == "BlockRemoved":
        return BlockRemoved(hashes, group, medium)
    parent = fields.get("parent_block_hash")
    token_ids = fields.get("token_ids") or ()
    if not isinstance(token_ids, list | tuple) or not all(_is_int(t) for t in token_ids):
        raise KvEventsError(f"BlockStored token_ids {token_ids!r:.80}: not ints", "field")
    block_size = fields.get("block_size") or 0
    if not _is_int(block_size):
        raise KvEventsError(f"BlockStored block_size {block_size!r:.40}: not an int", "field")
    extra = fields.get("extra_keys")
    if extra is not None and not isinstance(extra, list | tuple):
        raise KvEventsError(f"BlockStored extra_keys {extra!r:.40}: not a list", "field")
    keyed = bool(fields.get("lora_name") or fields.get("lora_id")) or bool(
        extra and any(k for k in extra)
    )
    return BlockStored(
        block_hashes=hashes,
        parent_block_hash=None if parent is None else _hash(parent),
        token_ids=tuple(token_ids),
        block_size=block_size,
        group_idx=group,
        medium=medium,
        keyed=keyed,
    )


def _optional(fields: dict[Any, Any], name: str, kind: type) -> Any:
    value = fields.get(name)
    if value is None or (isinstance(value, kind) and not isinstance(value, bool)):
        return value
    raise KvEventsError(f"KV event field {name} {value!r:.40}: not {kind.__name__}", "field")


def _hashes(value: Any) -> tuple[BlockHash, ...]:
    if value is None:
        return ()
    if not isinstance(value, list | tuple):
        raise KvEventsError(f"block_hashes {value!r:.40}: not a list", "field")
    return tuple(_hash(h) for h in value)


def _hash(value: Any) -> BlockHash:
    if isinstance(value, bytes) or _is_int(value):
        return value  # type: ignore[no-any-return]
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    raise KvEventsError(f"block hash {value!r:.80} is neither bytes nor an int", "field")
