"""Residency you can see, on the KV-event server (tiny dense model, 96-block cache, events over
ZMQ; conftest): every series the dashboard and the alert rules query is on a fresh router's
/metrics before any request; `GET /ready` answers 503 naming the prefix an eviction took and 200
again after its re-warm; the eviction is recorded at `GET /residency` with vLLM's pool usage, in
the log and in a metric; `residency status` shows it."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest
from kv_events_traffic import DIRECT_TOKENS, direct, events_ready, filler_words, metric, wait_for
from residency_cli import run_cli
from router_server import RouterProcess
from test_deploy import NAME, dashboard_exprs, rule_exprs
from vllm_pool import ServerSpec, VllmServerPool
from vllm_server import VllmServer

from residency.planning.plan_model import read_plan
from residency.serve.status_model import ResidencyStatus
from residency.vllm_client import parse_prometheus

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def events_server(vllm_pool: VllmServerPool, kv_events_spec: ServerSpec) -> VllmServer:
    return vllm_pool.get(kv_events_spec)


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
    router: RouterProcess, events_server: VllmServer
) -> None:
    plan = read_plan(router_plan(router))
    prefixes = len(plan.all_prefixes())
    wait_for(lambda: events_ready(router, prefixes), "every prefix whole from the events")
    wait_for(lambda: httpx.get(f"{router.base_url}/ready").status_code == 200, "/ready 200")
    before = status(router)
    assert before.ready and before.missing == []
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
            lambda: metric(router, "residency_router_prefix_rewarms_total", reason="evicted",
                           result="ok") >= 1,
            "a re-warm after the eviction",
        )  # fmt: skip
        wait_for(lambda: events_ready(router, prefixes), "every prefix whole again")
        wait_for(lambda: bool(watcher.seen) and watcher.seen[-1][1] == 200, "/ready 200 again")
    after = status(router)
    evicted = [p for p in after.prefixes if p.last_eviction is not None]
    assert evicted, after
    first = min((p.last_eviction for p in evicted if p.last_eviction), key=lambda e: e.at_unix_s)
    # /ready said 503 within a second of the first eviction, naming a prefix evicted then
    down = [(t, missing) for t, code, missing in watcher.seen if code == 503]
    assert down, "/ready never answered 503"
    assert down[0][0] - first.at_unix_s < 1.0, (down[0][0], first.at_unix_s)
    assert set(down[0][1]) <= {p.prefix for p in evicted}
    assert watcher.seen[-1][1] == 200
    # the record: blocks lost, no router request before it (the traffic went past the router),
    # vLLM's pool usage read right after
    assert first.blocks_lost >= 1
    assert first.resident_blocks < first.total_blocks
    assert first.admitted == []
    assert first.kv_cache_usage_perc is not None and 0 <= first.kv_cache_usage_perc <= 1
    assert all(p.rewarms >= 1 for p in evicted)
    lost = metric(router, "residency_router_prefix_blocks_evicted_total")
    assert lost >= sum(p.last_eviction.blocks_lost for p in evicted if p.last_eviction)
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
    for p in after.prefixes:
        assert p.prefix in table.stdout
    assert "resident" in table.stdout


def test_status_of_an_unreachable_router_is_one_line() -> None:
    done = run_cli("status", "http://127.0.0.1:9")
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "127.0.0.1:9" in lines[0], done.stderr
