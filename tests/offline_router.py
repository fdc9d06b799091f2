"""What the router tests that need no model server share: an offline plan of the sample corpus
(BM25 index, no server asked), a stand-in upstream process on a free port, the router's
Prometheus metrics, and a poll that waits on a condition (never on the clock)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
from residency_cli import run_cli
from vllm_server import REPO_ROOT

from residency.index import IndexOptions, build_index
from residency.tokenizer import LocalTokenizer
from residency.vllm_client import parse_prometheus, sum_samples

CORPUS = REPO_ROOT / "residency" / "data" / "corpora" / "harbor-lights" / "docs"
TESTS = Path(__file__).resolve().parent


_PLANS: dict[tuple[Path, int], Path] = {}


def offline_plan(root: Path, tokenizer_dir: Path, max_model_len: int = 8192) -> Path:
    """root/plan.json over root/index, a BM25 index of the sample corpus: built once per test
    run for each (tokenizer, window); later callers get the first one (read-only to them)."""
    key = (tokenizer_dir, max_model_len)
    if key in _PLANS and _PLANS[key].is_file():
        return _PLANS[key]
    _PLANS[key] = _build_offline_plan(root, tokenizer_dir, max_model_len)
    return _PLANS[key]


def _build_offline_plan(root: Path, tokenizer_dir: Path, max_model_len: int) -> Path:
    build_index(CORPUS, root / "index", IndexOptions(dense=False), LocalTokenizer(tokenizer_dir))
    out = root / "plan.json"
    done = run_cli(
        "plan",
        "--index",
        str(root / "index"),
        "--max-model-len",
        str(max_model_len),
        "-o",
        str(out),
    )
    assert done.returncode == 0, done.stderr
    return out


@contextmanager
def stand_in(script: str) -> Iterator[str]:
    """tests/<script> PORT running; yields its base URL."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, str(TESTS / script), str(port)])
    try:
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: _answers(url), f"{script} to listen on {port}", proc=proc)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def _answers(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=5).status_code == 200
    except httpx.TransportError:
        return False


def metric(url: str, name: str) -> float | None:
    """Sum of a Prometheus metric's samples at url/metrics (None when it has none)."""
    return sum_samples(parse_prometheus(httpx.get(f"{url}/metrics", timeout=10).text), name)


def wait_for(
    condition: Callable[[], bool],
    what: str,
    timeout_s: float = 180.0,
    proc: subprocess.Popen[bytes] | None = None,
) -> None:
    """Poll `condition` until it holds; fail naming `what` after a generous deadline."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert proc is None or proc.poll() is None, f"the process died waiting for {what}"
        assert time.monotonic() < deadline, f"timed out after {timeout_s:g} s waiting for {what}"
        time.sleep(0.05)
