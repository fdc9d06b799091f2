"""What the KV-event residency keeps per upstream (its subscription, block index and re-warm
prompts) and per pending re-warm (keep/kv_residency.py drives both)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from residency.keep.block_index import BlockIndex
from residency.keep.upstream import KeptUpstream
from residency.vllm_client.kv_events import EventSource

REWARMS_IN_FLIGHT = 4  # per upstream: a burst (a cleared cache) goes out a few at a time


@dataclass(slots=True)
class Pending:
    """A re-warm of one prefix on one upstream, waiting or under way."""

    reason: str
    go: asyncio.Event = field(default_factory=asyncio.Event)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    sent: bool = False
    again: bool = False  # evicted again while the re-warm was under way: one more after it
    carried: bool = False  # sent inside another prefix's re-warm request


@dataclass(slots=True)
class Tracked:
    """One upstream in events mode."""

    up: KeptUpstream
    source: EventSource
    index: BlockIndex = field(default_factory=BlockIndex)
    task: asyncio.Task[None] | None = None
    prompts: dict[str, tuple[int, ...]] = field(default_factory=dict)
    plan_key: tuple[str, ...] | None = None  # the prefix hashes the chains belong to
    slots: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(REWARMS_IN_FLIGHT))
