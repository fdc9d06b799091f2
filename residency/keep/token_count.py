"""Residency from the token count: keep every resident prefix cached between the questions
routed to it on an upstream that publishes no KV events (keeper.py picks the source).

vLLM keeps a finished request's full blocks cached in an LRU free queue: `BlockPool.free_blocks`
appends hashed blocks to the tail and `get_new_blocks` evicts what it pops from the head
(vllm/v1/core/block_pool.py, vLLM 0.32). Which blocks survive is decided by age, not by the plan:
a prefix that no request has used is evicted once the requests since its last use have allocated
about the plan's headroom (KV cache tokens minus resident tokens) in new blocks, while the blocks
of questions that will never come again stay. With several prefixes this is the common case: on
the English sample (19 prefixes, 10,752 tokens of headroom, SmolLM2 on vLLM CPU) 18 of the 78
questions sent through the router found their prefix's branch evicted and prefilled it again.

So the router keeps, per upstream and prefix, the new tokens that upstream's requests have
allocated since the prefix was last used: prompt tokens minus cached tokens plus completion
tokens, from each answer's usage. When the count reaches half the headroom the router sends one
touch: the prefix as the system message, a one-character question, `max_tokens` 1. The touch hits
every cached block of the prefix, and when it finishes vLLM appends them to the young end of the
queue. A touch costs the prefill of its last partial block and the question; a prefix that its
own questions keep using is never touched, and a single-prefix plan never sends one (every
request uses the prefix). Half the headroom leaves room for the requests in flight, whose blocks
are not in the queue at all.

What the router cannot see it cannot count: requests sent to vLLM past the router age the
prefixes too (`residency warm --watch` probes on a clock). Every request whose usage shows fewer
cached tokens than its prefix minus one block is counted in `residency_router_prefix_evictions`,
with keep-warm on or off.

All of this is the fallback. An upstream that publishes KV events reports what it stores and
evicts, whoever sent the request: there the router knows each prefix's resident blocks and
re-warms one when vLLM evicts it (residency/keep/kv_residency.py), and sends no touches
(`observe(..., touch=False)`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

import orjson

from residency.errors import ResidencyError
from residency.keep.upstream import KeepMetrics, KeptUpstream
from residency.planning.plan_model import ResidencyPlan
from residency.vllm_client import TransportError, Usage
from residency.vllm_client.wire import answer_usage

log = logging.getLogger("residency.serve")

TOUCH_QUESTION = "."
# Touches one upstream may have in flight: a burst (every idle prefix due at once after a warm)
# goes out a few at a time instead of all in one scheduler step.
TOUCHES_IN_FLIGHT = 4


@dataclass(frozen=True, slots=True)
class KeepWarmPolicy:
    """What keep-warm needs of a plan: each prefix's hash, text and the cached tokens a request
    on it should find, and the allocation after which an unused prefix is touched."""

    hashes: dict[str, str]  # prefix id -> prefix hash (a reloaded plan's prefixes are new keys)
    texts: dict[str, str]  # prefix id -> the exact system-message text
    expected: dict[str, int]  # prefix id -> cached tokens at least (its tokens minus one block)
    threshold_tokens: int | None  # None: count evictions, send no touches


def policy_of(plan: ResidencyPlan, touch: bool) -> KeepWarmPolicy:
    """The policy for `plan`; touches only where there are several prefixes and headroom."""
    prefixes = plan.all_prefixes()
    block = plan.capacity.block_size
    a = plan.arithmetic
    threshold = None
    if touch and len(prefixes) > 1 and a is not None and a.headroom_tokens > 0:
        threshold = max(a.headroom_tokens // 2, block)
    return KeepWarmPolicy(
        hashes={p.id: p.sha256 for p in prefixes},
        texts={p.id: p.prefix.text for p in prefixes},
        expected={p.id: max(p.tokens - block, 0) for p in prefixes},
        threshold_tokens=threshold,
    )


def new_tokens(usage: Usage, assumed_cached: int = 0) -> int:
    """Tokens a finished request allocated new blocks for (cached ones reuse blocks). A server
    without --enable-prompt-tokens-details reports no cached tokens: `assumed_cached` (its
    prefix, as if it hit) stands in, else every prefix would age by whole prompts."""
    prompt = usage.prompt_tokens or 0
    cached = usage.cached_tokens if usage.cached_tokens is not None else assumed_cached
    return max(prompt - cached, 0) + (usage.completion_tokens or 0)


class TokenCount:
    """Counts each prefix's age per upstream, touches the ones about to be evicted and counts
    the requests that found theirs evicted."""

    def __init__(self, metrics: KeepMetrics, current: Callable[[], KeepWarmPolicy]) -> None:
        self._metrics = metrics
        self._current = current  # the policy of the plan being served (reloads swap it)
        self._age: dict[tuple[int, str], int] = {}  # (upstream, prefix hash) -> new tokens
        self._in_flight: set[tuple[int, str]] = set()
        self._slots: dict[int, asyncio.Semaphore] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._policy: KeepWarmPolicy | None = None

    def warmed(self, up: KeptUpstream) -> None:
        """`up` was just warmed (it joined or came back, or a new plan was swapped in): every
        prefix is young on it."""
        self._age = {k: v for k, v in self._age.items() if k[0] != up.position}

    def age(self, up: KeptUpstream, prefix_id: str) -> int | None:
        """New tokens `up` allocated since the current plan's `prefix_id` was last used."""
        key = self._current().hashes.get(prefix_id)
        return None if key is None else self._age.get((up.position, key), 0)

    def observe(
        self, up: KeptUpstream, prefix_id: str | None, usage: Usage, touch: bool = True
    ) -> None:
        """Account a finished client request on `up` that went out with `prefix_id`; touch
        the prefixes it made due (unless `touch` is False: the engine's own events say when a
        prefix needs warming there)."""
        if usage.prompt_tokens is None:
            return
        policy = self._current()
        if policy is not self._policy:  # a reloaded plan: its prefixes start young (warmed)
            keep = set(policy.hashes.values())
            self._age = {k: v for k, v in self._age.items() if k[1] in keep}
            self._policy = policy
        cached, expected = usage.cached_tokens, policy.expected.get(prefix_id or "")
        if cached is not None and expected is not None and cached < expected:
            self._metrics.prefix_evictions.labels(prefix_id).inc()
        self._account(up, policy, prefix_id, usage)
        if policy.threshold_tokens is None or up.model is None or not up.usable or not touch:
            return
        for due, key in policy.hashes.items():
            k = (up.position, key)
            if self._age[k] >= policy.threshold_tokens and k not in self._in_flight:
                self._in_flight.add(k)
                task = asyncio.get_running_loop().create_task(self._touch(up, due, key, policy))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

    def _account(
        self, up: KeptUpstream, policy: KeepWarmPolicy, prefix_id: str | None, usage: Usage
    ) -> None:
        """Every prefix ages by the request's new tokens; the one it used is young again."""
        fresh = new_tokens(usage, policy.expected.get(prefix_id or "", 0))
        for key in policy.hashes.values():
            self._age[(up.position, key)] = self._age.get((up.position, key), 0) + fresh
        if prefix_id is not None and prefix_id in policy.hashes:
            self._age[(up.position, policy.hashes[prefix_id])] = 0

    async def _touch(
        self, up: KeptUpstream, prefix_id: str, key: str, policy: KeepWarmPolicy
    ) -> None:
        slots = self._slots.setdefault(up.position, asyncio.Semaphore(TOUCHES_IN_FLIGHT))
        result = "failed"
        try:
            async with slots:
                answer = await up.client.generate("chat", touch_payload(up, policy, prefix_id))
            self._metrics.agent.keep_warm_requests.labels(up.label, "touch").inc()
            if answer.status_code != 200:
                said = f"answered {answer.status_code}"
                log.info("upstream %s: keep-warm touch of %s %s", up.label, prefix_id, said)
            else:
                usage = Usage.of(answer_usage(answer.content))
                prefilled = max((usage.prompt_tokens or 0) - (usage.cached_tokens or 0), 0)
                self._metrics.agent.keep_warm_prefill_tokens.labels(up.label, "touch").inc(
                    prefilled
                )
                cached = usage.cached_tokens
                evicted = cached is not None and cached < policy.expected[prefix_id]
                result = "evicted" if evicted else "cached"
                if usage.prompt_tokens is not None:
                    self._account(up, self._current(), prefix_id, usage)
        except (TransportError, ResidencyError) as exc:
            log.info("upstream %s: keep-warm touch of %s failed (%s)", up.label, prefix_id, exc)
        finally:
            self._in_flight.discard((up.position, key))
        if result == "failed":  # not again before another threshold's worth of traffic
            self._age[(up.position, key)] = 0
        self._metrics.keep_warm_touches.labels(prefix_id, result).inc()

    async def settle(self) -> None:
        """Wait for the touches in flight."""
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def stop(self) -> None:
        """Cancel the touches in flight (at shutdown)."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


def touch_payload(up: KeptUpstream, policy: KeepWarmPolicy, prefix_id: str) -> bytes:
    """The touch request: the prefix as the first system message, as every routed request
    sends it (residency/context/prompt.py), a one-character question and one output token."""
    messages = [
        {"role": "system", "content": policy.texts[prefix_id]},
        {"role": "user", "content": TOUCH_QUESTION},
    ]
    body = {"model": up.model, "messages": messages, "max_tokens": 1, "temperature": 0}
    return orjson.dumps(body)
