"""`residency warm` against real vLLM CPU servers: the prefix is cached, and stays so under --watch.

Plans come from the real CLI (`residency plan --server URL`) over a BM25-only index of the sample
corpus. Every residency claim is checked with vLLM's own numbers: `cached_tokens` of the warm
probe, of router-shaped chat requests, and the prefix-cache metric deltas. The keep-warm loop runs
as a real subprocess against a server whose KV cache is shrunk with --num-gpu-blocks-override,
so one long prompt evicts the prefix.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from residency_cli import run_cli
from vllm_pool import ServerSpec, VllmServerPool
from vllm_server import REPO_ROOT, VllmServer, free_port, process_group_alive

from residency.index import IndexOptions, build_index
from residency.tokenizer import LocalTokenizer
from residency.vllm_client import Backoff, ServedModel, VllmClient, parse_prometheus, sum_samples
from residency.warm import WarmTarget, served_matches

CORPUS = REPO_ROOT / "residency" / "data" / "corpora" / "harbor-lights" / "docs"
WARM_ARGS = ("--enforce-eager", "--enable-prompt-tokens-details", "--enable-prefix-caching")
# Eviction server: 8192-token requests, 80 blocks of 128 = 10,240 KV tokens (vLLM needs >= one
# max_model_len request). The plan's ~4.6K-token prefix takes 36 blocks, so one 8,000-token
# prompt (63 blocks) must evict part of it.
SMALL_MAX_MODEL_LEN = 8192
SMALL_KV_BLOCKS = 80
FILLER_TOKENS = 8000


@pytest.mark.parametrize(
    ("shared_tokens", "block_size", "expected"),
    [
        pytest.param(29214, 128, 29184, id="dense-29K: 228 full blocks"),
        pytest.param(4621, 128, 4608, id="dense-4.6K: 36 full blocks"),
        pytest.param(28682, 256, 28672, id="hybrid-28.7K: 112 full blocks"),
        pytest.param(257, 256, 256, id="one block + 1: the last token is recomputed"),
        pytest.param(256, 256, 0, id="exactly one block: nothing cacheable"),
    ],
)
def test_expected_cached_tokens_are_full_blocks_before_the_last_token(
    shared_tokens: int, block_size: int, expected: int
) -> None:
    target = WarmTarget("tiny", tuple(range(shared_tokens)), shared_tokens, block_size, ())
    assert target.expected_cached_tokens == expected


@pytest.mark.parametrize(
    ("plan_model", "served_id", "root", "matches"),
    [
        pytest.param("qwen3.5-4b-fp8", "Qwen/Qwen3.5-4B-FP8", None, True, id="profile->hf-repo"),
        pytest.param("qwen3-8b", "Qwen/Qwen3.5-4B-FP8", None, False, id="other-profile"),
        pytest.param("/models/Qwen3-8B", "q", "Qwen/Qwen3-8B", True, id="path-vs-repo-name"),
        pytest.param("tiny", "tiny", "/nowhere/dense", True, id="served-name"),
        pytest.param("/models/dense", "tiny", "/models/hybrid", False, id="other-dir"),
    ],
)
def test_served_model_matching(
    plan_model: str, served_id: str, root: str | None, matches: bool
) -> None:
    served = ServedModel(id=served_id, root=root, max_model_len=32768)
    assert served_matches(plan_model, served) is matches


def test_same_directory_matches_by_path(tmp_path: Path) -> None:
    (tmp_path / "model").mkdir()
    served = ServedModel(id="tiny", root=str(tmp_path / "model"))
    assert served_matches(str(tmp_path / "x" / ".." / "model"), served)


def test_backoff_doubles_up_to_its_cap_and_resets() -> None:
    backoff = Backoff(1.0, 60.0)
    assert [backoff.next() for _ in range(8)] == [1, 2, 4, 8, 16, 32, 60, 60]
    backoff.reset()
    assert backoff.next() == 1


@pytest.fixture(scope="module")
def bm25_index(tmp_path_factory: pytest.TempPathFactory, tiny_tokenizer_dir: Path) -> Path:
    """A BM25-only index of the sample corpus, token counts from the tiny tokenizer."""
    index_dir = tmp_path_factory.mktemp("warm") / "index"
    build_index(
        CORPUS, index_dir, IndexOptions(dense=False), LocalTokenizer(tiny_tokenizer_dir), None
    )
    return index_dir


def make_plan(server_url: str, index_dir: Path, out: Path) -> Path:
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
    )
    assert done.returncode == 0, done.stderr
    return out


def warm_json(plan: Path, server_url: str, *extra: str) -> dict[str, Any]:
    """`residency warm --json`; asserts exit 0."""
    done = run_cli("warm", "--plan", str(plan), "--server", server_url, "--json", *extra)
    assert done.returncode == 0, done.stdout + done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def chat_cached_tokens(server_url: str, messages: list[dict[str, str]]) -> int:
    """cached_tokens of one router-shaped chat request (max_tokens=1)."""
    response = httpx.post(
        f"{server_url}/v1/chat/completions",
        json={"model": "tiny", "messages": messages, "max_tokens": 1, "temperature": 0},
        timeout=120,
    )
    response.raise_for_status()
    return int(response.json()["usage"]["prompt_tokens_details"]["cached_tokens"])


def reset_prefix_cache(server_url: str) -> None:
    """POST /reset_prefix_cache until vLLM reports success (it refuses while blocks are in use)."""
    with VllmClient(server_url, timeout_s=30) as client:
        for _ in range(50):
            if client.reset_prefix_cache():
                return
            time.sleep(0.2)
    raise AssertionError(f"{server_url}/reset_prefix_cache never succeeded")


def server_block_size(server_url: str) -> int:
    """The server's attention block size (`vllm:cache_config_info`)."""
    with VllmClient(server_url, timeout_s=30) as client:
        return int(client.cache_config_info()["block_size"])


def edited_plan(src: Path, dst: Path, edit: Callable[[dict[str, Any]], None]) -> Path:
    """A copy of plan.json with one field changed."""
    data = json.loads(src.read_text(encoding="utf-8"))
    edit(data)
    dst.write_text(json.dumps(data), encoding="utf-8")
    return dst


@pytest.fixture(scope="module")
def dense_plan(
    vllm_dense_server: VllmServer, bm25_index: Path, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """A plan made for the session dense server (max_model_len 32768: a ~29K-token prefix)."""
    return make_plan(
        vllm_dense_server.base_url, bm25_index, tmp_path_factory.mktemp("plans") / "plan.json"
    )


def assert_router_requests_hit(server_url: str, plan: Path, expected: int) -> None:
    """Chat requests shaped like the router's find exactly the warmed tokens cached."""
    prefix = json.loads(plan.read_text(encoding="utf-8"))["prefix"]["text"]
    system = {"role": "system", "content": prefix}
    question = {"role": "user", "content": "灯台の点検は何時に行いますか？"}
    assert chat_cached_tokens(server_url, [system, question]) == expected
    chunks = {"role": "system", "content": "[id: faq#x] 取り出した文書の断片"}
    assert chat_cached_tokens(server_url, [system, chunks, question]) == expected


@pytest.mark.vllm
def test_warm_dense_prefix_is_cached_and_router_requests_hit_it(
    vllm_dense_server: VllmServer, dense_plan: Path
) -> None:
    url = vllm_dense_server.base_url
    reset_prefix_cache(url)
    report = warm_json(dense_plan, url)
    assert report["resident"] is True
    plan = json.loads(dense_plan.read_text(encoding="utf-8"))
    assert report["prefix_tokens"] == plan["prefix"]["token_count"] > 20_000
    assert report["shared_prefix_tokens"] > report["prefix_tokens"]  # + chat template tokens
    assert report["block_size"] == 128
    expected = (report["shared_prefix_tokens"] - 1) // 128 * 128
    assert report["expected_cached_tokens"] == expected == report["cached_tokens"]
    first, last = report["sends"][0], report["sends"][-1]
    assert first["cached_tokens"] == 0  # reset above: the first send is a cold prefill
    assert report["sightings"] == 1
    assert last["metrics_hit_tokens"] == expected
    assert last["metrics_query_tokens"] == report["shared_prefix_tokens"]
    assert_router_requests_hit(url, dense_plan, expected)

    again = run_cli("warm", "--plan", str(dense_plan), "--server", url)
    assert again.returncode == 0, again.stderr
    assert "resident" in again.stdout
    assert f"cached {expected:,} of {expected:,} expected tokens" in again.stdout


@pytest.mark.vllm
def test_a_prefix_not_cached_after_the_sends_is_exit_2_with_the_numbers(
    vllm_dense_server: VllmServer, dense_plan: Path
) -> None:
    url = vllm_dense_server.base_url
    reset_prefix_cache(url)
    check = ("warm", "--plan", str(dense_plan), "--server", url, "--max-sightings", "0")
    cold = run_cli(*check)  # one cold send: it prefills, but cannot hit yet
    assert cold.returncode == 2, cold.stdout + cold.stderr
    assert "NOT cached" in cold.stdout
    message = " ".join(cold.stderr.split())
    assert "prefix not cached after 1 sightings: 0 of 29," in message
    assert "--max-sightings" in message
    again = run_cli(*check, "--json")  # the cold send admitted it: the check now passes
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["sightings"] == 0


def _text_edit(data: dict[str, Any]) -> None:
    data["prefix"]["text"] += "追記"
    for p in data.get("prefixes", ()):  # the plan's one prefix, listed: the same text
        p["prefix"]["text"] = data["prefix"]["text"]


def _model_edit(data: dict[str, Any]) -> None:
    data["capacity"]["model"] = "qwen3-8b"


def _length_edit(data: dict[str, Any]) -> None:
    data["capacity"]["max_model_len"] = 16384


@pytest.mark.vllm
@pytest.mark.parametrize(
    ("edit", "fragments"),
    [
        pytest.param(
            _text_edit,
            ["plan was made with tokenizer server:", "re-plan with --server", "tokens / hash"],
            id="prefix-tokens-differ",
        ),
        pytest.param(
            _model_edit,
            ["plan was made for model 'qwen3-8b'", "serves 'tiny'", "--allow-model-mismatch"],
            id="other-model",
        ),
        pytest.param(
            _length_edit,
            ["max_model_len 16384", "runs 32768", "--max-model-len 16384"],
            id="other-max-model-len",
        ),
    ],
)
def test_warm_refuses_a_server_that_differs_from_the_plan(
    vllm_dense_server: VllmServer,
    dense_plan: Path,
    tmp_path: Path,
    edit: Callable[[dict[str, Any]], None],
    fragments: list[str],
) -> None:
    plan = edited_plan(dense_plan, tmp_path / "plan.json", edit)
    done = run_cli("warm", "--plan", str(plan), "--server", vllm_dense_server.base_url)
    assert done.returncode == 1
    message = " ".join(done.stderr.split())
    assert message.startswith("error:")
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    for fragment in fragments:
        assert fragment in message


@pytest.mark.vllm
def test_allow_model_mismatch_warms_with_a_warning(
    vllm_dense_server: VllmServer, dense_plan: Path, tmp_path: Path
) -> None:
    plan = edited_plan(dense_plan, tmp_path / "plan.json", _model_edit)
    report = warm_json(plan, vllm_dense_server.base_url, "--allow-model-mismatch")
    assert report["resident"] is True
    assert report["cached_tokens"] == report["expected_cached_tokens"]
    assert any("qwen3-8b" in w for w in report["warnings"])


def test_unreachable_server_is_one_line_and_exit_1(
    bm25_index: Path, dense_model_dir: Path, tiny_tokenizer_dir: Path, tmp_path: Path
) -> None:
    plan = tmp_path / "plan.json"
    made = run_cli(
        "plan",
        "--model",
        str(dense_model_dir),
        "--platform",
        "cpu",
        "--kv-cache-memory-bytes",
        str(1 << 30),
        "--tokenizer-dir",
        str(tiny_tokenizer_dir),
        "--index",
        str(bm25_index),
        "-o",
        str(plan),
    )
    assert made.returncode == 0, made.stderr
    url = f"http://127.0.0.1:{free_port()}"
    done = run_cli("warm", "--plan", str(plan), "--server", url, "--timeout", "2")
    assert done.returncode == 1
    message = " ".join(done.stderr.split())
    assert f"--server {url}: /health did not answer 200 within 2 s" in message
    assert "--timeout" in message


@pytest.mark.vllm
def test_warm_hybrid_prefix_is_admitted_within_the_sightings(
    vllm_hybrid_server: VllmServer, bm25_index: Path, tmp_path: Path
) -> None:
    server = vllm_hybrid_server
    # A fresh cache: earlier tests on this shared server may have cached this very prefix.
    reset_prefix_cache(server.base_url)
    plan = make_plan(server.base_url, bm25_index, tmp_path / "plan.json")
    report = warm_json(plan, server.base_url)
    assert report["resident"] is True
    # The attention block grown to hold one GDN state: 256 tokens with a float32 state beside
    # bfloat16 attention (AVX512-BF16 CPUs), 128 otherwise (tests/test_harness.py).
    block = report["block_size"]
    assert block == server_block_size(server.base_url)
    assert block in (128, 256)
    expected = (report["shared_prefix_tokens"] - 1) // block * block
    assert report["expected_cached_tokens"] == expected == report["cached_tokens"] > 20_000
    assert 1 <= report["sightings"] <= 4  # align mode: admitted on the 2nd or a later send
    assert [s["cached_tokens"] for s in report["sends"][:-1]] == [0] * report["sightings"]
    assert_router_requests_hit(server.base_url, plan, expected)


class WatchProcess:
    """`residency warm --watch --json` as a subprocess; its event lines collected by a thread."""

    def __init__(self, plan: Path, server_url: str, metrics_port: int, stderr_path: Path) -> None:
        self.metrics_port = metrics_port
        self.stderr_path = stderr_path
        self.events: list[dict[str, Any]] = []
        with stderr_path.open("w") as stderr:  # a file, not a pipe nobody reads: it cannot fill
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "residency",
                    "warm",
                    "--plan",
                    str(plan),
                    "--server",
                    server_url,
                    "--watch",
                    "--interval",
                    "1",
                    "--max-backoff",
                    "2",
                    "--metrics-port",
                    str(metrics_port),
                    "--json",
                ],
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
                cwd=REPO_ROOT,
            )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.events.append(json.loads(line))

    def wait_for(self, event: str, after: int = 0, timeout_s: float = 90) -> dict[str, Any]:
        """The first `event` at or after position `after`; fails after timeout_s."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for found in self.events[after:]:
                if found["event"] == event:
                    return found
            assert self.process.poll() is None, self.stderr()
            time.sleep(0.2)
        raise AssertionError(
            f"no {event!r} event in {timeout_s} s; events: {self.events}; stderr: {self.stderr()}"
        )

    def stderr(self) -> str:
        """What the agent wrote to stderr so far."""
        return self.stderr_path.read_text(encoding="utf-8", errors="replace")

    def metric(self, name: str) -> float:
        """One residency_warm_* value from the agent's own /metrics."""
        text = httpx.get(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10).text
        value = sum_samples(parse_prometheus(text), name)
        assert value is not None, f"{name} missing from the agent's /metrics"
        return value

    def stop(self) -> int:
        """SIGTERM, then wait (SIGKILL only if it does not stop); every line read."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        self._reader.join(timeout=10)  # the last lines may still be in the pipe
        return self.process.returncode


def small_dense_spec(dense_model_dir: Path) -> ServerSpec:
    """Dense server with a KV cache of 80 blocks (10,240 tokens) and max_model_len 8192."""
    return ServerSpec(
        dense_model_dir,
        (*WARM_ARGS, "--num-gpu-blocks-override", str(SMALL_KV_BLOCKS)),
        max_model_len=SMALL_MAX_MODEL_LEN,
        name="dense-small-kv",
    )


@pytest.fixture
def small_dense_server(private_vllm: VllmServerPool, dense_model_dir: Path) -> VllmServer:
    """A private small-KV dense server: the test stops it and starts another on its port."""
    return private_vllm.private(small_dense_spec(dense_model_dir))


@pytest.fixture
def watch_factory(tmp_path: Path) -> Iterator[Callable[[Path, str], WatchProcess]]:
    """Start watch subprocesses; every one is stopped when the test ends."""
    started: list[WatchProcess] = []

    def start(plan: Path, server_url: str) -> WatchProcess:
        stderr_path = tmp_path / f"watch-{len(started)}.stderr"
        started.append(WatchProcess(plan, server_url, free_port(), stderr_path))
        return started[-1]

    yield start
    for process in started:
        process.stop()


def send_filler(server_url: str, rng: random.Random) -> int:
    """One long prompt of random token ids (never cached); returns its cached_tokens."""
    prompt = [rng.randrange(10, 7000) for _ in range(FILLER_TOKENS)]
    response = httpx.post(
        f"{server_url}/v1/completions",
        json={"model": "tiny", "prompt": prompt, "max_tokens": 1},
        timeout=120,
    )
    response.raise_for_status()
    return int(response.json()["usage"]["prompt_tokens_details"]["cached_tokens"])


@pytest.mark.vllm
def test_watch_rewarms_after_eviction_reset_sleep_and_restart(
    small_dense_server: VllmServer,
    private_vllm: VllmServerPool,
    dense_model_dir: Path,
    bm25_index: Path,
    tmp_path: Path,
    watch_factory: Callable[[Path, str], WatchProcess],
) -> None:
    url = small_dense_server.base_url
    plan = make_plan(url, bm25_index, tmp_path / "plan.json")
    watcher = watch_factory(plan, url)
    warmed = watcher.wait_for("warm")
    assert warmed["resident"] is True
    expected = warmed["expected_cached_tokens"]
    assert expected // 128 + -(-FILLER_TOKENS // 128) > SMALL_KV_BLOCKS  # a filler must evict

    # 1. Eviction: one long prompt needs more blocks than are free beside the prefix.
    rng = random.Random(7)
    assert send_filler(url, rng) == 0
    rewarm = watcher.wait_for("rewarm", after=watcher.events.index(warmed))
    assert rewarm["resident"] is True
    assert rewarm["cached_tokens"] == expected
    assert watcher.wait_for("miss")["cached_tokens"] < expected
    assert watcher.metric("residency_warm_rewarms_total") >= 1
    assert warm_json(plan, url)["sightings"] == 0  # a later probe finds it resident

    # 2. /reset_prefix_cache empties the cache: the next probe misses, the agent re-warms.
    seen = len(watcher.events)
    reset_prefix_cache(url)
    assert watcher.wait_for("rewarm", after=seen)["resident"] is True
    assert watcher.metric("residency_warm_rewarms_total") >= 2

    # 3. Sleep and wake (dev mode) drop the prefix cache: the agent waits, then re-warms.
    seen = len(watcher.events)
    httpx.post(f"{url}/sleep", params={"level": 1}, timeout=30).raise_for_status()
    watcher.wait_for("sleeping", after=seen)
    httpx.post(f"{url}/wake_up", timeout=30).raise_for_status()
    watcher.wait_for("awake", after=seen)
    assert watcher.wait_for("rewarm", after=seen)["resident"] is True

    # 4. The server dies and a new one starts on the same port: down, up, residency restored.
    port, pgid = small_dense_server.port, small_dense_server.pid
    assert pgid is not None
    seen = len(watcher.events)
    small_dense_server.stop()
    assert not process_group_alive(pgid)  # API server, engine core and worker are all gone
    watcher.wait_for("down", after=seen)
    assert watcher.metric("residency_warm_server_up") == 0
    assert watcher.process.poll() is None  # a dead server is transient: the agent waits
    private_vllm.private(small_dense_spec(dense_model_dir), port=port)
    watcher.wait_for("up", after=seen)
    back = watcher.wait_for("rewarm", after=seen)
    assert back["resident"] is True
    assert back["cached_tokens"] == expected
    assert watcher.metric("residency_warm_server_up") == 1
    assert warm_json(plan, url)["sightings"] == 0
    # One scrape, so the counters and the ratio describe the same moment.
    text = httpx.get(f"http://127.0.0.1:{watcher.metrics_port}/metrics", timeout=10).text
    samples = parse_prometheus(text)
    probes = sum_samples(samples, "residency_warm_probes_total")
    hits = sum_samples(samples, "residency_warm_probe_hits_total")
    ratio = sum_samples(samples, "residency_warm_resident_hit_ratio")
    assert probes is not None
    assert probes > 0
    assert hits is not None
    assert ratio == pytest.approx(hits / probes, abs=1e-9), text
    assert watcher.stop() == 0
    assert watcher.events[-1]["event"] == "stop"
