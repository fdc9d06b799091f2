"""`residency warm --watch`: keep the prefix resident and say so in Prometheus metrics.

Every interval one probe (the warm prompt again, max_tokens=1) touches the prefix, which moves
its blocks to the young end of vLLM's LRU free queue, and reads `cached_tokens`. A probe below
the expected cached tokens (eviction, a restarted server, `/reset_prefix_cache`, sleep/wake) has
already prefilled the prefix again; for hybrid models more sends follow until one hits, within
`max_sightings`. A server that is down or answers errors is retried with capped exponential
backoff; the loop ends only when `stop` is set (SIGINT/SIGTERM in the CLI).
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Callable
from typing import Literal

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server
from pydantic import BaseModel, ConfigDict, Field

from residency.errors import ConfigError, UpstreamError, UpstreamMismatchError
from residency.planning.plan_model import ResidencyPlan
from residency.vllm_client import Backoff, SendResult, VllmClient
from residency.warm.options import WarmOptions, WatchSettings
from residency.warm.prefill import admit, open_client
from residency.warm.verify import WarmTarget, check_server

EventName = Literal[
    "warm", "miss", "rewarm", "down", "up", "mismatch", "error", "sleeping", "awake", "stop"
]


class WatchEvent(BaseModel):
    """One log line of the watch loop (probe hits are not events)."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    event: EventName = Field(description="What happened.")
    at: dt.datetime = Field(description="When (UTC).")
    message: str = Field(description="One readable sentence with the numbers.")
    resident: bool | None = Field(default=None, description="The prefix is cached now.")
    cached_tokens: int | None = Field(default=None, ge=0, description="Last send's cached.")
    expected_cached_tokens: int | None = Field(default=None, ge=0, description="Full blocks.")
    sightings: int | None = Field(default=None, ge=0, description="Sends before the hit.")
    ttft_s: float | None = Field(default=None, ge=0, description="Last send's TTFT.")
    prefix: str | None = Field(
        default=None, description="The plan's prefix id, when it has several."
    )


class WatchMetrics:
    """The agent's own Prometheus metrics, in a registry of their own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.probe_count = self.hit_count = 0
        r = self.registry
        self.probes = Counter("residency_warm_probes", "Periodic probes sent.", registry=r)
        self.hits = Counter(
            "residency_warm_probe_hits", "Probes that found the prefix cached.", registry=r
        )
        self.rewarms = Counter("residency_warm_rewarms", "Re-warms after a miss.", registry=r)
        self.ttft = Gauge(
            "residency_warm_last_probe_ttft_seconds", "TTFT of the last probe.", registry=r
        )
        self.ratio = Gauge(
            "residency_warm_resident_hit_ratio", "Probe hits / probes since start.", registry=r
        )
        self.up = Gauge("residency_warm_server_up", "1 when /health answers 200.", registry=r)
        self.cached = Gauge(
            "residency_warm_cached_tokens", "Cached tokens of the last send.", registry=r
        )
        self.expected = Gauge(
            "residency_warm_expected_cached_tokens", "Full blocks of the shared prefix.", registry=r
        )

    def record_probe(self, probe: SendResult, hit: bool) -> None:
        """Count one periodic probe."""
        self.probe_count += 1
        self.hit_count += int(hit)
        self.probes.inc()
        if hit:
            self.hits.inc()
        self.ttft.set(probe.ttft_s)
        self.cached.set(probe.hit_tokens())
        self.ratio.set(self.hit_count / self.probe_count)


class _ServerDownError(Exception):
    """/health does not answer 200."""


class Watcher:
    """The keep-warm loop's state: the target, whether the server is up, the last problem."""

    def __init__(
        self,
        plan: ResidencyPlan,
        options: WarmOptions,
        settings: WatchSettings,
        client: VllmClient,
        emit: Callable[[WatchEvent], None],
        metrics: WatchMetrics,
    ) -> None:
        self.plan, self.options, self.settings = plan, options, settings
        self.client, self.emit, self.metrics = client, emit, metrics
        self.target: WarmTarget | None = None
        self.up: bool | None = None
        self.problem: str | None = None
        self.sleeping = False
        self.warmed = False
        self.backoff = Backoff(1.0, settings.max_backoff_s)

    def _event(
        self,
        event: EventName,
        message: str,
        send: SendResult | None = None,
        resident: bool | None = None,
        sightings: int | None = None,
    ) -> None:
        target = self.target
        self.emit(
            WatchEvent(
                event=event,
                at=dt.datetime.now(dt.UTC),
                message=message,
                resident=resident,
                cached_tokens=send.hit_tokens() if send else None,
                expected_cached_tokens=target.expected_cached_tokens if target else None,
                sightings=sightings,
                ttft_s=send.ttft_s if send else None,
            )
        )

    def run(self, stop: threading.Event) -> None:
        """Probe every interval until `stop` is set; back off while the server is unusable."""
        while not stop.is_set():
            stop.wait(self.tick())
        self._event("stop", "stopped (signal)")

    def tick(self) -> float:
        """One step with its error handling; the seconds until the next."""
        try:
            delay = self.step()
            self.backoff.reset()
        except _ServerDownError:
            delay = self.backoff.next()
        except (UpstreamMismatchError, ConfigError) as exc:
            self.target = None
            self._problem("mismatch", str(exc))
            delay = self.backoff.next()
        except UpstreamError as exc:
            self.target = None
            if not self.client.health():
                self._mark_down(str(exc))
            else:
                self._problem("error", str(exc))
            delay = self.backoff.next()
        return delay

    def _problem(self, event: EventName, message: str) -> None:
        if message != self.problem:  # one line per change, not one per retry
            self.problem = message
            self._event(event, message)

    def _mark_down(self, reason: str) -> None:
        self.metrics.up.set(0)
        if self.up is not False:
            self.up = False
            self._event("down", f"{self.client.base_url} is down: {reason}; retrying with backoff")

    def step(self) -> float:
        """One probe (or the first warm after start / a restart); the seconds until the next."""
        if self.target is None:
            if not self.client.health():
                self._mark_down("/health does not answer 200")
                raise _ServerDownError
            if self.up is False:
                self._event("up", f"{self.client.base_url} answers /health again")
            self.up, self.problem = True, None
            self.metrics.up.set(1)
            target = check_server(self.plan, self.client, self.options.allow_model_mismatch)
            self.metrics.expected.set(target.expected_cached_tokens)
            sends = admit(self.client, target, self.options.max_sightings)
            self.target = target
            if self.warmed:  # after a restart, a mismatch or an error: the cache starts empty
                self.metrics.rewarms.inc()
            self._admitted("rewarm" if self.warmed else "warm", target, sends)
            self.warmed = True
            return self.settings.interval_s
        target = self.target
        if self._asleep():
            return self.settings.interval_s
        probe = self.client.prefill(target.served_model, target.prompt_ids)
        hit = probe.hit_tokens() >= target.expected_cached_tokens
        self.metrics.record_probe(probe, hit)
        if hit:
            return self.settings.interval_s
        self._event(
            "miss",
            f"probe found {probe.hit_tokens():,} of {target.expected_cached_tokens:,} expected "
            "cached tokens (evicted, reset or restarted); re-warming",
            send=probe,
            resident=False,
        )
        self.metrics.rewarms.inc()
        # The missed probe was the first sighting; admit() adds at most max_sightings more.
        more = admit(self.client, target, self.options.max_sightings - 1)
        self._admitted("rewarm", target, [probe, *more])
        return self.settings.interval_s

    def _asleep(self) -> bool:
        """True while the server sleeps (a probe would wait for wake-up); logs the changes."""
        sleeping = self.client.is_sleeping() is True
        if sleeping != self.sleeping:
            self.sleeping = sleeping
            if sleeping:
                self._event("sleeping", f"{self.client.base_url} is asleep; waiting for wake-up")
            else:
                self._event("awake", f"{self.client.base_url} woke up; probing")
        return sleeping

    def _admitted(self, event: EventName, target: WarmTarget, sends: list[SendResult]) -> None:
        last = sends[-1]
        resident = last.hit_tokens() >= target.expected_cached_tokens
        sightings = len(sends) - 1 if resident else len(sends)
        self.metrics.cached.set(last.hit_tokens())
        if not resident:
            outcome = f"NOT resident after {sightings} sightings (--max-sightings)"
        elif sightings == 0:
            outcome = "already resident"
        else:
            outcome = f"resident after {sightings} sighting(s)"
        self._event(
            event,
            f"{outcome}: cached {last.hit_tokens():,} of {target.expected_cached_tokens:,} "
            f"expected tokens ({len(target.prompt_ids):,}-token shared prefix, block "
            f"{target.block_size}); TTFT {sends[0].ttft_s:.3f} s -> {last.ttft_s:.3f} s",
            send=last,
            resident=resident,
            sightings=sightings,
        )


def watch(
    plan: ResidencyPlan,
    options: WarmOptions,
    settings: WatchSettings,
    emit: Callable[[WatchEvent], None],
    stop: threading.Event,
) -> None:
    """Run the keep-warm loop (and the metrics endpoint, if asked) until `stop` is set."""
    metrics = WatchMetrics()
    http_server = None
    if settings.metrics_port is not None:
        try:
            http_server, _ = start_http_server(
                settings.metrics_port, addr=settings.metrics_host, registry=metrics.registry
            )
        except OSError as exc:
            raise ConfigError(
                f"--metrics-port {settings.metrics_port} on --metrics-host "
                f"{settings.metrics_host}: cannot listen ({exc.strerror})"
            ) from None
    try:
        with open_client(options) as client:
            prefixes = plan.all_prefixes()
            if len(prefixes) == 1:
                Watcher(plan, options, settings, client, emit, metrics).run(stop)
                return
            # One watcher per prefix, stepped in turn: a miss re-warms only that prefix.
            watchers = [
                Watcher(plan.for_prefix(p.id), options, settings, client, _tag(emit, p.id), metrics)
                for p in prefixes
            ]
            while not stop.is_set():
                stop.wait(min([w.tick() for w in watchers]))
            emit(WatchEvent(event="stop", at=dt.datetime.now(dt.UTC), message="stopped (signal)"))
    finally:
        if http_server is not None:
            http_server.shutdown()
            http_server.server_close()


def _tag(emit: Callable[[WatchEvent], None], prefix_id: str) -> Callable[[WatchEvent], None]:
    """`emit` with the prefix id on every event (and at the head of its message)."""

    def tagged(event: WatchEvent) -> None:
        emit(
            event.model_copy(
                update={"prefix": prefix_id, "message": f"[{prefix_id}] {event.message}"}
            )
        )

    return tagged
