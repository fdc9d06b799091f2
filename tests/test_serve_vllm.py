"""`residency serve` as a real process (uvicorn) in front of real vLLM CPU servers.

The router's choices are checked against the library computing the same thing in-process
(`ContextBuilder`), and every cache claim against vLLM's own `cached_tokens`.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from residency_cli import run_cli
from router_server import RouterProcess
from vllm_pool import ServerSpec, VllmServerPool
from vllm_server import REPO_ROOT, VllmServer

from residency.context.builder import ContextBuilder, Retrieval
from residency.context.headers import parse_retrieved_header
from residency.context.prompt import assemble_messages
from residency.context.routing import RoutingSettings
from residency.context.settings import ContextSettings
from residency.corpus.squad import questions_file
from residency.eval.coverage_runs import squad_corpus
from residency.index import IndexOptions, build_index, open_index
from residency.planning.plan_model import ResidencyPlan, read_plan
from residency.query_log import read_query_log
from residency.tokenizer import LocalTokenizer
from residency.vllm_client import parse_prometheus, sum_samples
from residency.vllm_client.sse import DONE_DATA, data_events

pytestmark = pytest.mark.vllm

CORPUS = REPO_ROOT / "residency" / "data" / "corpora" / "harbor-lights" / "docs"
JSQUAD = REPO_ROOT.parent / "shared/data/jsquad/valid-v1.3.json"
TODAY = "2025-06-15"
BLOCK = 128  # the CPU build's block size for the tiny dense model
ROUTER_ARGS = ("--retriever", "bm25", "--today", TODAY)


def make_plan(server_url: str, index_dir: Path, out: Path, *extra: str) -> Path:
    """`residency plan --server URL --platform cpu --index DIR -o out`."""
    done = run_cli(
        "plan",
        "--server",
        server_url,
        "--platform",
        "cpu",
        "--index",
        str(index_dir),
        "-o",
        str(out),
        "--prefixes",
        "1",
        *extra,
    )
    assert done.returncode == 0, done.stderr
    return out


def builder_for(plan: Path, index_dir: Path, upstream: str) -> ContextBuilder:
    """The library's view of what the router does for a question (same settings)."""
    settings = ContextSettings(
        retriever="bm25", routing=RoutingSettings(today=dt.date.fromisoformat(TODAY))
    )
    return ContextBuilder(read_plan(plan), open_index(index_dir), settings)


def chat(router: RouterProcess, question: str, **extra: Any) -> httpx.Response:
    """A non-streaming chat request through the router."""
    body = {"messages": [{"role": "user", "content": question}], "max_tokens": 4, **extra}
    body.setdefault("temperature", 0)
    return httpx.post(f"{router.base_url}/v1/chat/completions", json=body, timeout=300)


def retrieved(response: httpx.Response) -> list[str]:
    """Section ids of the X-Residency-Retrieved header (which must be there)."""
    return list(parse_retrieved_header(response.headers["x-residency-retrieved"]))


def sse_events(response: httpx.Response) -> Iterator[dict[str, Any] | str]:
    """Parsed 'data:' events of a streamed response ('[DONE]' as the string)."""
    for data in data_events(response.iter_bytes()):
        yield "[DONE]" if data == DONE_DATA else json.loads(data)


def fold_stream(events: list[dict[str, Any] | str]) -> tuple[str, list[Any]]:
    """A chat stream as (its whole text, its events without id, created and delta text, runs of
    equal events folded into one): what must match whichever way vLLM split the text."""
    text: list[str] = []
    shapes: list[Any] = []
    for event in events:
        if isinstance(event, dict):
            event = {k: v for k, v in event.items() if k not in ("id", "created")}
            choices = []
            for choice in event.get("choices", []):
                delta = dict(choice.get("delta") or {})
                text.append(delta.pop("content", None) or "")
                choices.append({**choice, "delta": delta, "finish_reason": None})
            event = {**event, "choices": choices}
        if not shapes or shapes[-1] != event:
            shapes.append(event)
    finish = [
        c.get("finish_reason") for e in events if isinstance(e, dict) for c in e.get("choices", [])
    ]
    return "".join(text), [*shapes, [f for f in finish if f]]


def log_records(router: RouterProcess, at_least: int = 1) -> list[dict[str, Any]]:
    """The router's query-log lines, once it has written `at_least` of them (it logs a
    non-streamed request just after sending the answer)."""
    deadline = time.monotonic() + 10
    while True:
        text = router.query_log.read_text("utf-8") if router.query_log.exists() else ""
        lines = [json.loads(x) for x in text.splitlines()]
        if len(lines) >= at_least or time.monotonic() > deadline:
            return lines
        time.sleep(0.05)


def metric(url: str, name: str) -> float:
    """Sum of a Prometheus metric's samples at url/metrics."""
    return sum_samples(parse_prometheus(httpx.get(f"{url}/metrics", timeout=10).text), name)


@pytest.fixture(scope="module")
def sample_index(tmp_path_factory: pytest.TempPathFactory, tiny_tokenizer_dir: Path) -> Path:
    """A BM25-only index of the sample corpus, token counts from the tiny tokenizer."""
    index_dir = tmp_path_factory.mktemp("serve") / "index"
    build_index(
        CORPUS, index_dir, IndexOptions(dense=False), LocalTokenizer(tiny_tokenizer_dir), None
    )
    return index_dir


@pytest.fixture(scope="module")
def sample_plan(
    vllm_dense_server: VllmServer, sample_index: Path, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """A ~29K-token plan for the session dense server."""
    out = tmp_path_factory.mktemp("serve-plan") / "plan.json"
    return make_plan(vllm_dense_server.base_url, sample_index, out)


@pytest.fixture(scope="module")
def router(
    vllm_dense_server: VllmServer, sample_plan: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RouterProcess]:
    """The router over the dense server, warmed at start."""
    proc = RouterProcess(
        sample_plan, [vllm_dense_server.base_url], tmp_path_factory.mktemp("router"), ROUTER_ARGS
    )
    with proc:
        yield proc


@pytest.fixture(scope="module")
def builder(sample_plan: Path, sample_index: Path, vllm_dense_server: VllmServer) -> ContextBuilder:
    return builder_for(sample_plan, sample_index, vllm_dense_server.base_url)


def first_question(
    builder: ContextBuilder, plan: ResidencyPlan, route: str
) -> tuple[str, Retrieval]:
    """A question (a section title) whose route is `route`, with the library's retrieval."""
    ids = (
        [i.section_id for i in plan.resident] if route == "resident" else plan.long_tail_section_ids
    )
    for sid in ids:
        title = builder.index.section(sid).title
        if not title:
            continue
        r = builder.retrieve(title.split(" > ")[-1] + "について教えて")
        if r.route == route and (
            route == "resident" or sid in {builder.index.section_of(c) for c in r.chunk_ids}
        ):
            return r.question, r
    raise AssertionError(f"no section title routes {route}")


def test_resident_route_hits_the_warmed_prefix(
    router: RouterProcess, builder: ContextBuilder, sample_plan: Path
) -> None:
    plan = read_plan(sample_plan)
    question, expected = first_question(builder, plan, "resident")
    response = chat(router, question)
    assert response.status_code == 200, response.text
    assert response.headers["x-residency-route"] == "resident"
    assert retrieved(response) == [builder.index.section_of(c) for c in expected.chunk_ids]
    usage = response.json()["usage"]
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    assert plan.prefix.token_count > 20_000
    assert cached >= plan.prefix.token_count - BLOCK  # the prefix, minus at most one block
    assert usage["prompt_tokens"] > plan.prefix.token_count


def test_long_tail_question_gets_its_section_retrieved(
    router: RouterProcess, builder: ContextBuilder, sample_plan: Path
) -> None:
    plan = read_plan(sample_plan)
    question, expected = first_question(builder, plan, "long_tail")
    response = chat(router, question)
    assert response.status_code == 200, response.text
    assert response.headers["x-residency-route"] == "long_tail"
    sections = retrieved(response)
    assert sections == list(dict.fromkeys(builder.index.section_of(c) for c in expected.chunk_ids))
    assert not set(sections) & {i.section_id for i in plan.resident if i.id == i.section_id}
    cached = response.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= plan.prefix.token_count - BLOCK  # retrieved text comes after the prefix


def test_time_expression_pins_dated_notes_and_states_the_period(
    router: RouterProcess, builder: ContextBuilder
) -> None:
    response = chat(router, "去年の年末から正月にかけて、灯台でどんな故障があった？")
    assert response.status_code == 200, response.text
    r = builder.retrieve("去年の年末から正月にかけて、灯台でどんな故障があった？")
    assert r.period is not None
    if r.dated_section_ids:  # in-range notes that are not resident are pinned first
        assert response.headers["x-residency-route"] == "dated"
        assert retrieved(response)[: len(r.dated_section_ids)] == list(r.dated_section_ids)
    for sid in r.dated_section_ids:
        day = builder.index.section(sid).date
        assert day is not None
        assert r.period.contains(day)
    deadline = time.monotonic() + 10
    while not any("年末" in x["query"] for x in log_records(router)):
        assert time.monotonic() < deadline, "the request was not logged"
        time.sleep(0.05)
    record = next(x for x in log_records(router) if "年末" in x["query"])
    assert "2024-12-25" in record["period"]
    assert "2025-01-07" in record["period"]


def test_streaming_passes_through_token_for_token(
    router: RouterProcess, builder: ContextBuilder, vllm_dense_server: VllmServer, sample_plan: Path
) -> None:
    plan = read_plan(sample_plan)
    question, r = first_question(builder, plan, "long_tail")
    body = {"max_tokens": 24, "temperature": 0, "stream": True}
    messages = assemble_messages(
        [{"role": "user", "content": question}], plan.prefix.text, builder.render(r, r.chunk_ids)
    )
    with httpx.stream(
        "POST",
        f"{vllm_dense_server.base_url}/v1/chat/completions",
        json={
            **body,
            "model": "tiny",
            "messages": messages,
            "stream_options": {"include_usage": True},
        },
        timeout=300,
    ) as direct:
        # The router always asks for usage (to read cached tokens) and drops the usage-only
        # chunk for a client that did not: compare with the same upstream request.
        upstream = [e for e in sse_events(direct) if isinstance(e, str) or e["choices"]]
    with httpx.stream(
        "POST",
        f"{router.base_url}/v1/chat/completions",
        json={**body, "messages": [{"role": "user", "content": question}]},
        timeout=300,
    ) as routed:
        assert routed.headers["content-type"].startswith("text/event-stream")
        through = list(sse_events(routed))
    assert through[-1] == upstream[-1] == "[DONE]"
    # vLLM itself merges the deltas a slow reader has not yet taken (two tokens in one chunk,
    # at random on a loaded machine), so two requests need not split the text alike: compare
    # the text, and every event with its text taken out, runs of equal events folded.
    assert fold_stream(through) == fold_stream(upstream)
    assert len(through) >= 4  # role chunk, text, finish chunk, [DONE]: streamed, not buffered
    assert all(isinstance(e, str) or e.get("usage") is None for e in through)

    # Asked for usage: the usage chunk passes through, with the prefix cached.
    with httpx.stream(
        "POST",
        f"{router.base_url}/v1/chat/completions",
        json={
            **body,
            "messages": [{"role": "user", "content": question}],
            "stream_options": {"include_usage": True},
        },
        timeout=300,
    ) as routed:
        events = [e for e in sse_events(routed) if isinstance(e, dict)]
    usage = events[-1]["usage"]
    assert events[-1]["choices"] == []
    assert usage["prompt_tokens_details"]["cached_tokens"] >= plan.prefix.token_count - BLOCK


def test_completions_endpoint_sends_the_same_cached_prefix(
    router: RouterProcess, sample_plan: Path
) -> None:
    plan = read_plan(sample_plan)
    response = httpx.post(
        f"{router.base_url}/v1/completions",
        json={"prompt": "灯台の点検はいつ？", "max_tokens": 4, "temperature": 0},
        timeout=300,
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["object"] == "text_completion"
    assert (
        body["usage"]["prompt_tokens_details"]["cached_tokens"] >= plan.prefix.token_count - BLOCK
    )
    bad = httpx.post(f"{router.base_url}/v1/completions", json={"prompt": [1, 2, 3]}, timeout=30)
    assert bad.status_code == 400
    assert bad.json()["error"]["type"] == "invalid_request_error"


def test_bad_requests_get_openai_shaped_400s(router: RouterProcess) -> None:
    url = f"{router.base_url}/v1/chat/completions"
    cases = [
        httpx.post(
            url, content=b"{not json", headers={"Content-Type": "application/json"}, timeout=30
        ),
        httpx.post(url, json={"messages": []}, timeout=30),
        httpx.post(url, json={"messages": [{"role": "system", "content": "x"}]}, timeout=30),
    ]
    for response in cases:
        assert response.status_code == 400
        assert set(response.json()["error"]) >= {"message", "type", "code"}
    missing = httpx.get(f"{router.base_url}/v1/nothing", timeout=30)
    assert missing.status_code == 404
    assert missing.json()["error"]["type"] == "invalid_request_error"


def test_models_health_metrics_and_the_query_log_closes_the_loop(
    router: RouterProcess, sample_index: Path, tmp_path: Path
) -> None:
    before = len(log_records(router, 0))
    chat(router, "霧信号はどの灯台にある？")
    log_records(router, before + 1)
    models = httpx.get(f"{router.base_url}/v1/models", timeout=30).json()
    assert [m["id"] for m in models["data"]] == ["tiny"]
    assert httpx.get(f"{router.base_url}/health", timeout=30).json()["upstreams_usable"] == 1
    text = httpx.get(f"{router.base_url}/metrics", timeout=30).text
    samples = parse_prometheus(text)
    assert sum_samples(samples, "residency_router_requests_total") >= 1
    assert 0.5 < sum_samples(samples, "residency_router_prefix_cache_hit_ratio") <= 1
    assert sum_samples(samples, "residency_router_retrieval_seconds_count") >= 1
    assert "127.0.0.1" not in text  # upstreams are labelled by position only

    log = read_query_log(router.query_log)
    assert log.skipped == ()
    records = [json.loads(x) for x in router.query_log.read_text("utf-8").splitlines()]
    assert all(
        {"route", "retrieved", "cached_tokens", "retrieval_ms", "total_ms"} <= r.keys()
        for r in records
        if r["outcome"] == "ok"
    )
    for r in (r for r in records if r["outcome"] == "ok"):
        # Timings start at arrival: the router's own work includes retrieval, TTFT includes both.
        assert r["retrieval_ms"] <= r["forward_ms"] <= r["ttft_ms"] <= r["total_ms"]
    out = tmp_path / "replan.json"
    done = run_cli(
        "plan",
        "--index",
        str(sample_index),
        "--log",
        str(router.query_log),
        "--max-model-len",
        "8192",
        "-o",
        str(out),
        "--json",
        "--prefixes",
        "1",
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(out.read_text("utf-8"))["log"]["entries"] == len(log.entries)


def test_client_disconnect_cancels_the_upstream_request(
    router: RouterProcess, vllm_dense_server: VllmServer
) -> None:
    url = vllm_dense_server.base_url
    body = {
        "messages": [{"role": "user", "content": "長い答えを"}],
        "max_tokens": 3000,
        "ignore_eos": True,
        "stream": True,
    }
    with httpx.stream(
        "POST", f"{router.base_url}/v1/chat/completions", json=body, timeout=300
    ) as response:
        events = sse_events(response)
        for _ in range(3):
            next(events)
        # vLLM sets the gauge after it has handed the step's tokens out: poll, don't read once
        running = time.monotonic() + 10
        while metric(url, "vllm:num_requests_running") != 1:
            assert time.monotonic() < running, "vLLM does not report the streaming request"
            time.sleep(0.1)
    deadline = time.monotonic() + 30
    while metric(url, "vllm:num_requests_running") != 0:
        assert time.monotonic() < deadline, "vLLM still runs the request of a gone client"
        time.sleep(0.25)


@contextlib.contextmanager
def dead_port() -> Iterator[int]:
    """A port bound but not listening (connections are refused), held for the block."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


def test_no_healthy_upstream_is_a_503_that_names_no_address(
    tmp_path: Path, sample_plan: Path
) -> None:
    with dead_port() as port:
        _no_upstream(tmp_path, sample_plan, port)


def _no_upstream(tmp_path: Path, sample_plan: Path, port: int) -> None:
    proc = RouterProcess(sample_plan, [f"http://127.0.0.1:{port}"], tmp_path, ("--no-warm",))
    with proc.start(require_healthy=False):
        response = chat(proc, "灯台は？")
        assert response.status_code == 503
        error = response.json()["error"]
        assert error["type"] == "service_unavailable"
        assert str(port) not in response.text
        assert "127.0.0.1" not in response.text
        assert httpx.get(f"{proc.base_url}/health", timeout=10).status_code == 503
        assert httpx.get(f"{proc.base_url}/v1/models", timeout=10).status_code == 503
    record = json.loads(proc.query_log.read_text("utf-8").splitlines()[-1])
    assert record["outcome"] == "unavailable"
    assert record["status_code"] == 503


def test_api_key_is_required_and_exposure_without_one_is_refused(
    tmp_path: Path, sample_plan: Path
) -> None:
    refused = run_cli("serve", "--plan", str(sample_plan), "--host", "0.0.0.0", timeout=60)
    assert refused.returncode == 1
    assert len(refused.stderr.strip().splitlines()) == 1
    assert "--api-key" in refused.stderr
    assert "Traceback" not in refused.stderr

    key = "test-key-123456"
    with dead_port() as port:
        proc = RouterProcess(
            sample_plan,
            [f"http://127.0.0.1:{port}"],
            tmp_path,
            ("--no-warm",),
            env={"RESIDENCY_API_KEY": key},
        )
        try:
            proc.start(require_healthy=False)
            assert chat(proc, "灯台は？").status_code == 401
            denied = httpx.get(f"{proc.base_url}/metrics", timeout=10)
            assert denied.status_code == 401
            assert denied.json()["error"]["code"] == "invalid_api_key"
            bearer = {"Authorization": f"Bearer {key}"}
            ok = httpx.get(f"{proc.base_url}/metrics", headers=bearer, timeout=10)
            assert ok.status_code == 200
            assert httpx.get(f"{proc.base_url}/health", timeout=10).status_code == 503  # open
        finally:
            proc.stop()


def _stream_until_end(
    url: str, body: dict[str, Any], out: list[Any], started: threading.Event, stop: threading.Event
) -> None:
    with httpx.stream("POST", url, json=body, timeout=300) as response:
        if response.status_code != 200:
            out.append(f"HTTP {response.status_code}: {response.read()!r}")
            started.set()
            return
        for event in sse_events(response):
            started.set()
            out.append(event)
            if stop.is_set():
                return  # the client goes away mid-stream


def test_balancing_and_an_upstream_killed_mid_stream(
    private_vllm: VllmServerPool,
    dense_model_dir: Path,
    vllm_dense_server: VllmServer,
    sample_index: Path,
    tmp_path: Path,
) -> None:
    # A ~6K-token prefix leaves room for long answers: streams outlive the kill below.
    plan = make_plan(
        vllm_dense_server.base_url,
        sample_index,
        tmp_path / "plan.json",
        "--reserve-retrieved",
        "24000",
    )
    doomed = private_vllm.private(
        ServerSpec(
            dense_model_dir,
            ("--enforce-eager", "--enable-prompt-tokens-details", "--enable-prefix-caching"),
            name="doomed",
        )
    )
    proc = RouterProcess(plan, [doomed.base_url, vllm_dense_server.base_url], tmp_path, ROUTER_ARGS)
    with proc:
        body = {
            "messages": [{"role": "user", "content": "長い答えを"}],
            "max_tokens": 20000,
            "ignore_eos": True,
            "stream": True,
        }
        url = f"{proc.base_url}/v1/chat/completions"
        outs: list[list[Any]] = [[] for _ in range(4)]
        starts = [threading.Event() for _ in outs]
        stop = threading.Event()
        threads = [
            threading.Thread(target=_stream_until_end, args=(url, body, out, started, stop))
            for out, started in zip(outs, starts, strict=True)
        ]
        for t in threads:
            t.start()
        for out, started in zip(outs, starts, strict=True):
            assert started.wait(180), proc.log_tail()
            assert not isinstance(out[0], str), out[0]
        samples = parse_prometheus(httpx.get(f"{proc.base_url}/metrics", timeout=10).text)
        per = {
            s.labels["upstream"]: s.value
            for s in samples
            if s.name == "residency_router_upstream_outstanding_requests"
        }
        assert per == {"0": 2.0, "1": 2.0}  # least outstanding: two each

        assert doomed.pid is not None
        os.killpg(doomed.pid, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while sum(t.is_alive() for t in threads) > 2:
            assert time.monotonic() < deadline, "streams of a killed upstream did not end"
            time.sleep(0.2)
        ended = [o for o, t in zip(outs, threads, strict=True) if not t.is_alive()]
        for out in ended:
            assert out[-1] == "[DONE]"
            assert out[-2]["error"]["type"] == "server_error"
        stop.set()  # the healthy upstream's two streams: the clients hang up
        for t in threads:
            t.join(60)
        after = chat(proc, "霧信号はどの灯台にある？")
        assert after.status_code == 200, (after.text, proc.log_tail())  # the healthy one
    records = [json.loads(x) for x in proc.query_log.read_text("utf-8").splitlines()]
    by_outcome = sorted((r["outcome"], r["upstream"]) for r in records)
    assert by_outcome == [
        ("disconnected", "1"),
        ("disconnected", "1"),
        ("ok", "1"),
        ("upstream_error", "0"),
        ("upstream_error", "0"),
    ]


@pytest.mark.skipif(not JSQUAD.is_file(), reason=f"JSQuAD not found at {JSQUAD}")
def test_jsquad_questions_whose_paragraph_is_not_resident_get_it_retrieved(
    vllm_dense_server: VllmServer, tiny_tokenizer_dir: Path, tmp_path: Path
) -> None:
    corpus = squad_corpus(JSQUAD, REPO_ROOT / ".cache" / "coverage")
    index_dir = tmp_path / "index"
    build_index(
        corpus,
        index_dir,
        IndexOptions(dense=False),
        LocalTokenizer(tiny_tokenizer_dir),
        None,
    )
    # A small resident budget (~6K tokens) leaves most paragraphs to retrieval.
    plan_path = make_plan(
        vllm_dense_server.base_url,
        index_dir,
        tmp_path / "plan.json",
        "--reserve-retrieved",
        "23000",
    )
    plan = read_plan(plan_path)
    resident = {i.section_id for i in plan.resident}
    qa_text = questions_file(corpus).read_text("utf-8")
    questions = [json.loads(x) for x in qa_text.splitlines()]
    tail = [q for q in questions if not set(q["relevant_ids"]) & resident][:30]
    assert len(tail) == 30
    proc = RouterProcess(plan_path, [vllm_dense_server.base_url], tmp_path, ROUTER_ARGS)
    with proc:
        found = 0
        for q in tail:
            response = chat(proc, q["query"], max_tokens=1)
            assert response.status_code == 200, response.text
            found += bool(set(retrieved(response)) & set(q["relevant_ids"]))
    assert found >= 27, f"gold paragraph retrieved for {found} of 30 long-tail questions"


def test_eval_answers_residency_strategy_goes_through_the_router(
    router: RouterProcess,
    vllm_dense_server: VllmServer,
    sample_plan: Path,
    sample_index: Path,
    tmp_path: Path,
) -> None:
    plan = read_plan(sample_plan)
    resident = {i.section_id for i in plan.resident}
    questions = [
        json.loads(x)
        for x in (REPO_ROOT / "residency/data/corpora/harbor-lights/qa.jsonl")
        .read_text("utf-8")
        .splitlines()
    ]
    # One question per type, so the per-type table has every row.
    picked: dict[str, dict[str, Any]] = {}
    for q in questions:
        picked.setdefault(q["type"], q)
    qa = tmp_path / "qa.jsonl"
    qa.write_text("".join(json.dumps(q, ensure_ascii=False) + "\n" for q in picked.values()))
    records = tmp_path / "records.jsonl"
    url = vllm_dense_server.base_url
    done = run_cli(
        "eval",
        "answers",
        "--questions",
        str(qa),
        "--index",
        str(sample_index),
        "--strategy",
        "residency",
        "--strategy",
        "rag",
        "--router",
        router.base_url,
        "--plan",
        str(sample_plan),
        "--generator",
        url,
        "--judge",
        url,
        "--max-tokens",
        "8",
        "--judge-max-tokens",
        "32",
        "--records",
        str(records),
        "--json",
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    lines = [json.loads(x) for x in records.read_text("utf-8").splitlines()]
    ours = [r for r in lines if r["strategy"] == "residency"]
    assert len(ours) == len(picked) == 6
    for r in ours:
        assert r["route"] in ("resident", "long_tail", "dated")
        assert r["cached_tokens"] >= plan.prefix.token_count - BLOCK  # the router's prefix
        gold = set(r["relevant_ids"])
        expected_visible = bool(gold & (resident | set(r["retrieved_ids"])))
        if gold:
            assert r["evidence_visible"] is expected_visible
    assert {s["strategy"] for s in report["strategies"]} == {"residency", "rag-top3"}


def test_pruner_stage_grades_long_tail_passages_with_structured_output(
    vllm_dense_server: VllmServer,
    sample_plan: Path,
    builder: ContextBuilder,
    tmp_path: Path,
) -> None:
    question, expected = first_question(builder, read_plan(sample_plan), "long_tail")
    assert len(expected.chunk_ids) > 1
    url = vllm_dense_server.base_url
    args = (*ROUTER_ARGS, "--pruner-url", url, "--pruner-model", "tiny", "--prune-keep-top-k", "1")
    with RouterProcess(sample_plan, [url], tmp_path, args) as proc:
        response = chat(proc, question)
        assert response.status_code == 200, response.text
        record = log_records(proc)[-1]
        kept = retrieved(response)
        samples = parse_prometheus(httpx.get(f"{proc.base_url}/metrics", timeout=10).text)
    assert record["pruner_valid"] is True  # schema-valid grades from the tiny model
    assert record["pruned"] == len(expected.chunk_ids) - len(record["chunks"])
    assert record["chunks"][0] == expected.chunk_ids[0]  # the keep-top-k floor
    assert 1 <= len(record["chunks"]) <= len(expected.chunk_ids)
    assert kept == list(dict.fromkeys(builder.index.section_of(c) for c in record["chunks"]))
    assert sum_samples(samples, "residency_router_prune_seconds_count") == 1
    assert sum_samples(samples, "residency_router_pruner_invalid_total") == 0


def test_an_upstream_slower_than_the_request_timeout_is_a_504_and_stays_in_rotation(
    vllm_dense_server: VllmServer, sample_plan: Path, tmp_path: Path
) -> None:
    args = (*ROUTER_ARGS, "--no-warm", "--request-timeout", "2")
    with RouterProcess(sample_plan, [vllm_dense_server.base_url], tmp_path, args) as proc:
        slow = chat(proc, "長い答えを", max_tokens=3000, ignore_eos=True)
        assert slow.status_code == 504, slow.text
        assert slow.json()["error"]["code"] == "upstream_timeout"
        assert "127.0.0.1" not in slow.text
        health = httpx.get(f"{proc.base_url}/health", timeout=10).json()
        assert health["upstreams_usable"] == 1  # slow is not down
        record = log_records(proc)[-1]
    assert (record["outcome"], record["status_code"], record["upstream"]) == (
        "upstream_error",
        504,
        "0",
    )
