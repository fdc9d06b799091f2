"""Residency you can see, on the KV-event server (tiny dense model, 96-block cache, events over
ZMQ; conftest): every series the dashboard and the alert rules query is on a fresh router's
/metrics before any request; `GET /ready` answers 503 naming the prefix an eviction took and 200
again after its re-warm; the eviction is recorded at `GET /residency` with vLLM's pool usage, in
the log and in a metric; `residency status` shows it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import orjson
import pytest
from kv_events_traffic import (
    BLOCK_SIZE,
    DIRECT_TOKENS,
    direct,
    events_ready,
    filler_words,
    metric,
    wait_for,
)
from residency_cli import run_cli
from router_server import RouterProcess
from test_deploy import NAME, dashboard_exprs, rule_exprs
from vllm_server import VllmServer

from residency.planning.plan_model import read_plan
from residency.status.model import ResidencyStatus
from residency.vllm_client import parse_prometheus

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def router(
    events_server: VllmServer, kv_events_plan: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RouterProcess]:
    """A router on the KV-event plan, started on a cleared cache; nothing sent through it."""
    httpx.post(f"{events_server.base_url}/reset_prefix_cache", timeout=60)
    args = ("--retriever", "bm25", "--rewarm-interval", "0.5")
    root = tmp_path_factory.mktemp("status")
    with RouterProcess(kv_events_plan, [events_server.base_url], root, args) as r:
        yield r


def test_every_series_the_dashboard_and_rules_query_exists_before_any_request(
    router: RouterProcess,
) -> None:
    text = httpx.get(f"{router.base_url}/metrics", timeout=30).text
    sampled = {s.name for s in parse_prometheus(text)}
    queried = {n for e in dashboard_exprs() + rule_exprs() for n in NAME.findall(e)}
    assert len(queried) >= 25
    assert sorted(queried - sampled) == []
    assert metric(router, "residency_router_requests_total") == 0  # indeed before any request
    # Per prefix and upstream: the series a rate alert needs exist at 0.
    prefixes = [p.id for p in read_plan(router_plan(router)).all_prefixes()]
    evictions = parse_prometheus(text)
    labelled = {
        s.labels["prefix"]
        for s in evictions
        if s.name == "residency_router_prefix_block_evictions_total" and s.labels["upstream"] == "0"
    }
    assert labelled == set(prefixes)


def router_plan(router: RouterProcess) -> Path:
    command = list(router.command)
    return Path(command[command.index("--plan") + 1])


def status(router: RouterProcess) -> ResidencyStatus:
    answer = httpx.get(f"{router.base_url}/residency", timeout=30)
    assert answer.status_code == 200, answer.text
    return ResidencyStatus.model_validate_json(answer.content)


class ReadyWatcher:
    """Polls /ready every 20 ms in a thread: (monotonic time, status code, missing)."""

    def __init__(self, router: RouterProcess) -> None:
        self.seen: list[tuple[float, int, list[str]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(router.base_url,), daemon=True)

    def _run(self, base: str) -> None:
        with httpx.Client(base_url=base, timeout=30) as client:
            while not self._stop.is_set():
                answer = client.get("/ready")
                self.seen.append((time.time(), answer.status_code, answer.json()["missing"]))
                self._stop.wait(0.02)

    def __enter__(self) -> ReadyWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


def test_ready_flips_on_an_eviction_and_back_after_the_rewarm_which_status_records(
    router: RouterProcess,
    events_server: VllmServer,
    record_property: Callable[[str, object], None],
) -> None:
    plan = read_plan(router_plan(router))
    prefixes = len(plan.all_prefixes())
    wait_for(lambda: events_ready(router, prefixes), "every prefix whole from the events")
    wait_for(lambda: httpx.get(f"{router.base_url}/ready").status_code == 200, "/ready 200")
    before = status(router)
    assert before.ready
    assert before.missing == []
    assert {p.state for p in before.prefixes} == {"resident"}
    assert {p.mode for p in before.prefixes} == {"events"}
    words = filler_words(events_server, DIRECT_TOKENS)
    with ReadyWatcher(router) as watcher:
        n = 0
        while metric(router, "residency_router_prefix_block_evictions_total") == 0:
            assert n < 20, "20 requests past the router evicted no planned prefix"
            direct(events_server, 200 + n, words)
            n += 1
        wait_for(
            lambda: (
                metric(
                    router, "residency_router_prefix_rewarms_total", reason="evicted", result="ok"
                )
                >= 1
            ),
            "a re-warm after the eviction",
        )
        wait_for(lambda: events_ready(router, prefixes), "every prefix whole again")
        wait_for(lambda: bool(watcher.seen) and watcher.seen[-1][1] == 200, "/ready 200 again")
    after = status(router)
    assert after.ready
    assert after.evictions, after
    first = after.evictions[0]
    evicted = {e.prefix for e in after.evictions}
    # /ready said 503 after vLLM published the first eviction, naming only prefixes that were
    # evicted
    down = [(t, missing) for t, code, missing in watcher.seen if code == 503]
    assert down, "/ready never answered 503"
    lag_s = down[0][0] - first.engine_at_unix_s  # a figure for the record, not a bound
    record_property("ready_503_after_eviction_s", round(lag_s, 3))
    print(f"\n/ready answered 503 {lag_s:.3f} s after vLLM published the first eviction")
    assert lag_s > -0.1  # not before it (one machine's clock)
    assert set(down[0][1]) <= evicted
    assert watcher.seen[-1][1] == 200
    # each record: blocks lost, no router request before it (the traffic went past the
    # router), vLLM's pool usage read right after
    for e in after.evictions:
        assert 1 <= e.blocks_lost <= e.total_blocks - e.resident_blocks + e.blocks_lost
        assert e.resident_blocks < e.total_blocks
        assert e.admitted == []
        assert e.kv_cache_usage_perc is not None
        assert 0 <= e.kv_cache_usage_perc <= 1
    rows = {(p.upstream, p.prefix): p for p in after.prefixes}
    assert all(rows[("0", prefix)].rewarms >= 1 for prefix in evicted)
    assert all(rows[("0", prefix)].last_eviction is not None for prefix in evicted)
    lost = metric(router, "residency_router_prefix_blocks_evicted_total")
    assert lost == sum(e.blocks_lost for e in after.evictions)
    assert "router requests in the preceding 1 s: none (traffic past the router)" in (
        router.log_text()
    )

    # `residency status` reads the same picture
    done = run_cli("status", router.base_url, "--json")
    assert done.returncode == 0, done.stderr
    shown = ResidencyStatus.model_validate(orjson.loads(done.stdout))
    assert {(p.upstream, p.prefix) for p in shown.prefixes} == {
        (p.upstream, p.prefix) for p in after.prefixes
    }
    table = run_cli("status", router.base_url)
    assert table.returncode == 0, table.stderr
    for row in after.prefixes:
        assert row.prefix in table.stdout
    assert "resident" in table.stdout


def test_status_of_an_unreachable_router_is_one_line() -> None:
    done = run_cli("status", "http://127.0.0.1:9")
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "127.0.0.1:9" in lines[0]


def test_status_reads_a_vllm_server_without_a_router(
    router: RouterProcess, events_server: VllmServer
) -> None:
    """--plan and the server's URL: the picture from its replayed events agrees with the
    router's, and a prefix shown resident is served from vLLM's prefix cache (its own
    counters); without --plan, one line for the server."""
    plan = read_plan(router_plan(router))
    wait_for(lambda: events_ready(router, len(plan.all_prefixes())), "every prefix whole")
    routed = {p.prefix: p for p in status(router).prefixes}
    done = run_cli("status", events_server.base_url, "--plan", str(router_plan(router)), "--json")
    assert done.returncode == 0, done.stderr
    direct_view = ResidencyStatus.model_validate(orjson.loads(done.stdout))
    assert [u.mode for u in direct_view.upstreams] == ["events"]
    for p in direct_view.prefixes:
        assert p.total_blocks == routed[p.prefix].total_blocks
        assert p.resident_blocks == routed[p.prefix].resident_blocks, p
        assert p.state == "resident"
    # vLLM's own counters: the prefix's resident blocks are hits
    prefix = plan.all_prefixes()[0]
    before = vllm_hits(events_server)
    messages = [
        {"role": "system", "content": prefix.prefix.text},
        {"role": "user", "content": "."},
    ]
    answer = httpx.post(
        f"{events_server.base_url}/v1/chat/completions",
        json={"model": "tiny", "max_tokens": 1, "messages": messages},
        timeout=300,
    )
    assert answer.status_code == 200, answer.text
    shown = next(p for p in direct_view.prefixes if p.prefix == prefix.id)
    assert shown.resident_blocks is not None
    assert vllm_hits(events_server) - before >= shown.resident_blocks * BLOCK_SIZE

    bare = run_cli("status", events_server.base_url, "--json")
    assert bare.returncode == 0, bare.stderr
    one = ResidencyStatus.model_validate(orjson.loads(bare.stdout))
    assert one.prefixes == []
    assert [(u.healthy, u.mode) for u in one.upstreams] == [(True, "events")]


def vllm_hits(server: VllmServer) -> float:
    text = httpx.get(f"{server.base_url}/metrics", timeout=30).text
    return sum(s.value for s in parse_prometheus(text) if s.name == "vllm:prefix_cache_hits_total")


def test_status_of_an_unreachable_server_with_a_plan_is_one_line(router: RouterProcess) -> None:
    done = run_cli("status", "http://127.0.0.1:9", "--plan", str(router_plan(router)))
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "cannot reach http://127.0.0.1:9" in lines[0]
