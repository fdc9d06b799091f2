"""Plan reloads that need no model server: a real `residency serve` process whose only upstream
is a closed port (nothing in rotation, so nothing to warm), offline plans of the sample corpus.
Warming before the swap, requests in flight and vLLM's cache are in test_serve_reload_vllm.py."""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
from pathlib import Path

import httpx
import orjson
import pytest
from offline_router import wait_for
from residency_cli import run_cli
from router_server import RouterProcess
from vllm_server import REPO_ROOT

from residency.index import IndexOptions, build_index
from residency.tokenizer import LocalTokenizer
from residency.vllm_client import find_samples, parse_prometheus

CORPUS = REPO_ROOT / "residency" / "data" / "corpora" / "harbor-lights" / "docs"
ARGS = ("--no-warm", "--retriever", "bm25")


@pytest.fixture(scope="module")
def plans(tmp_path_factory: pytest.TempPathFactory, tiny_tokenizer_dir: Path) -> dict[str, Path]:
    """a and b: two offline plans of one index (8K and 16K windows); no-index: b pointing at
    an index that does not exist; torn: b pointing at a copy of the index whose BM25 data file
    lost its second half (a copy cut short)."""
    root = tmp_path_factory.mktemp("reload")
    build_index(
        CORPUS, root / "index", IndexOptions(dense=False), LocalTokenizer(tiny_tokenizer_dir), None
    )
    out = {name: root / f"{name}.json" for name in ("a", "b", "no-index", "torn")}
    for name, window in (("a", "8192"), ("b", "16384")):
        done = run_cli(
            "plan", "--index", str(root / "index"), "--max-model-len", window, "-o", str(out[name])
        )
        assert done.returncode == 0, done.stderr
    data = orjson.loads(out["b"].read_bytes())
    out["no-index"].write_bytes(orjson.dumps({**data, "index_dir": str(root / "missing")}))
    shutil.copytree(root / "index", root / "index-torn")
    torn = next((root / "index-torn").rglob("bm25.data.csc.npy"))
    torn.write_bytes(torn.read_bytes()[: torn.stat().st_size // 2])
    out["torn"].write_bytes(orjson.dumps({**data, "index_dir": str(root / "index-torn")}))
    return out


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def replace(path: Path, data: bytes) -> None:
    """Write `data` to `path` the way `residency plan` does: temp file, then rename."""
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def served_sha(router: RouterProcess) -> str:
    return str(httpx.get(f"{router.base_url}/health", timeout=10).json()["plan_sha256"])


def reloads(router: RouterProcess, result: str) -> float:
    text = httpx.get(f"{router.base_url}/metrics", timeout=10).text
    found = find_samples(parse_prometheus(text), "residency_router_plan_reloads_total")
    return sum(s.value for s in found if s.labels == {"result": result})


def lines(router: RouterProcess, needle: str) -> list[str]:
    return [x for x in router.log_text().splitlines() if needle in x]


def test_sighup_refuses_bad_plans_in_one_line_each_then_swaps_a_good_one(
    plans: dict[str, Path], dead_upstream: str, tmp_path: Path
) -> None:
    path = tmp_path / "plan.json"
    path.write_bytes(plans["a"].read_bytes())
    a = sha(plans["a"])
    with RouterProcess(path, [dead_upstream], tmp_path, ARGS).start(require_healthy=False) as r:
        assert served_sha(r) == a
        assert reloads(r, "ok") == reloads(r, "refused") == 0
        bad = [
            (b"{not json", "not valid JSON"),
            (b'{"format_version": 1}', "not a residency plan (it lacks created_at"),
            (plans["no-index"].read_bytes(), "is not a residency index (no manifest.json)"),
        ]
        for n, (data, why) in enumerate(bad, start=1):
            replace(path, data)
            os.kill(r.pid or 0, signal.SIGHUP)
            wait_for(lambda n=n: reloads(r, "refused") == n, f"refusal {n}")
            refused = lines(r, "plan reload refused (SIGHUP)")
            assert len(refused) == n
            assert why in refused[-1]
            assert refused[-1].endswith(f"still serving plan {a[:12]}")
            assert served_sha(r) == a

        replace(path, plans["b"].read_bytes())
        os.kill(r.pid or 0, signal.SIGHUP)
        wait_for(lambda: served_sha(r) == sha(plans["b"]), "the swap")
        ok = lines(r, "plan reloaded (SIGHUP)")
        assert len(ok) == 1
        assert f"{a[:12]} -> {sha(plans['b'])[:12]}" in ok[0]
        assert "warmed on 0 upstream(s) (none in rotation)" in ok[0]
        assert reloads(r, "ok") == 1
        assert reloads(r, "refused") == len(bad)

        os.kill(r.pid or 0, signal.SIGHUP)  # the same file again: nothing to do
        wait_for(lambda: bool(lines(r, "unchanged; nothing to do")), "the no-op")
        assert reloads(r, "ok") == 1


def test_watch_plan_reloads_on_change_and_tries_a_bad_file_once(
    plans: dict[str, Path], dead_upstream: str, tmp_path: Path
) -> None:
    path = tmp_path / "plan.json"
    path.write_bytes(plans["a"].read_bytes())
    args = (*ARGS, "--watch-plan")
    with RouterProcess(path, [dead_upstream], tmp_path, args).start(require_healthy=False) as r:
        replace(path, b"{not json")
        wait_for(lambda: reloads(r, "refused") == 1, "the refusal")
        replace(path, plans["b"].read_bytes())
        wait_for(lambda: served_sha(r) == sha(plans["b"]), "--watch-plan")
        assert len(lines(r, "plan reloaded (--watch-plan)")) == 1
        assert reloads(r, "refused") == 1  # the bad file was tried once, not every poll


def test_a_reload_that_raises_anything_is_refused_out_loud(
    plans: dict[str, Path], dead_upstream: str, tmp_path: Path
) -> None:
    """Reproduction 4: a torn index file raises numpy's ValueError, not a ResidencyError; it
    used to escape the reload task with no log line and no count. Now it is refused like any
    other failure, the old plan keeps serving, and the next reload still works."""
    path = tmp_path / "plan.json"
    path.write_bytes(plans["a"].read_bytes())
    a = sha(plans["a"])
    with RouterProcess(path, [dead_upstream], tmp_path, ARGS).start(require_healthy=False) as r:
        replace(path, plans["torn"].read_bytes())
        os.kill(r.pid or 0, signal.SIGHUP)
        wait_for(lambda: reloads(r, "refused") == 1, "the refusal")
        refused = lines(r, "plan reload refused (SIGHUP)")
        assert len(refused) == 1, r.log_tail()
        assert f"plan {sha(plans['torn'])[:12]}: " in refused[0]
        assert "Error" in refused[0]  # the exception's type names what failed
        assert refused[0].endswith(f"still serving plan {a[:12]}")
        assert served_sha(r) == a
        assert "Traceback" not in r.log_text()

        replace(path, plans["b"].read_bytes())  # the reloader is not stuck
        os.kill(r.pid or 0, signal.SIGHUP)
        wait_for(lambda: served_sha(r) == sha(plans["b"]), "the swap")
        assert reloads(r, "ok") == 1
