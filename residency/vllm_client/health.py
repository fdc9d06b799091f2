"""Waiting for a server: capped exponential backoff, and polling `/health` until it answers."""

from __future__ import annotations

import time
from collections.abc import Callable

from residency.errors import UpstreamError
from residency.vllm_client.sync_client import VllmClient


class Backoff:
    """Exponential delays: first, 2x first, ... capped; `reset` starts over."""

    def __init__(self, first_s: float = 1.0, cap_s: float = 60.0) -> None:
        self.first_s, self.cap_s, self._next = first_s, cap_s, first_s

    def next(self) -> float:
        """The delay to wait now; doubles the one after."""
        delay, self._next = self._next, min(self._next * 2, self.cap_s)
        return delay

    def reset(self) -> None:
        """Back to the first delay (after a success)."""
        self._next = self.first_s


def wait_for_health(
    client: VllmClient, timeout_s: float, sleep: Callable[[float], None] = time.sleep
) -> int:
    """Poll `/health` with exponential backoff (0.5 s doubling, at most 10 s); the tries it took."""
    deadline = time.monotonic() + timeout_s
    backoff = Backoff(0.5, 10.0)
    tries = 0
    while True:
        tries += 1
        if client.health():
            return tries
        left = deadline - time.monotonic()
        if left <= 0:
            raise UpstreamError(
                f"{client.where}: /health did not answer 200 within {timeout_s:g} s "
                f"({tries} tries); is vLLM running there? (--timeout to wait longer)"
            )
        sleep(min(backoff.next(), left))
