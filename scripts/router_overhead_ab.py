"""Router overhead, before and after a change, paired in one run against one real vLLM.

    .venv/bin/python scripts/router_overhead_ab.py --before /path/to/old/checkout [--pairs 300]

Starts vLLM CPU on the tiny dense model, plans a ~29K-token prefix on the sample corpus, then
two routers on it: this checkout's and the one at --before (each `python -m residency serve`
run from its own tree, same plan, index and flags). Requests rotate direct -> before -> after
(the order shifted every round) on the resident route, non-streaming, max_tokens=1, as
benchmarks/test_bench_router.py sends them; overhead = a router's percentile minus direct's.
Prints the figures as JSON with the machine they were measured on.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
from vllm_server import VllmServer  # noqa: E402

from residency.context.builder import ContextBuilder  # noqa: E402
from residency.context.prompt import assemble_messages  # noqa: E402
from residency.context.settings import ContextSettings  # noqa: E402
from residency.index import IndexOptions, build_index, open_index  # noqa: E402
from residency.launcher import ManagedServer, free_port  # noqa: E402
from residency.machine import machine_info  # noqa: E402
from residency.models.tiny import DENSE_SPEC, build_tiny_model  # noqa: E402
from residency.models.tokenizer import ensure_tokenizer  # noqa: E402
from residency.planning.plan_model import read_plan  # noqa: E402
from residency.stats import percentile  # noqa: E402
from residency.tokenizer import LocalTokenizer  # noqa: E402

QUESTIONS = (
    "霧信号はどの灯台にある？",
    "しおかぜ丸は何人乗れる？",
    "灯台の点検は何時に行いますか？",
)
SERVER_ARGS = ("--enforce-eager", "--enable-prompt-tokens-details", "--enable-prefix-caching")


def _router(tree: Path, plan: Path, upstream: str, tmp: Path, name: str) -> ManagedServer:
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "residency",
        "serve",
        "--plan",
        str(plan),
        "--port",
        str(port),
        "--upstream",
        upstream,
        "--retriever",
        "bm25",
        "--today",
        "2025-06-15",
        "--log",
        str(tmp / f"{name}-queries.jsonl"),
    ]
    return ManagedServer(
        f"router ({name})", command, port=port, log_path=tmp / f"{name}.log", cwd=tree
    ).start(timeout_s=240)


def _post(client: httpx.Client, url: str, body: dict[str, Any]) -> float:
    started = time.perf_counter()
    response = client.post(url, json=body)
    elapsed = time.perf_counter() - started
    if response.status_code != 200:
        raise SystemExit(f"{url} answered {response.status_code}: {response.text[:200]}")
    return elapsed


def _pct(values: list[float], q: float) -> float:
    return percentile(values, q) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, required=True, help="checkout of the old code")
    parser.add_argument("--pairs", type=int, default=300, help="requests per path")
    args = parser.parse_args()
    before_tree = args.before.resolve()
    if not (before_tree / "residency" / "__init__.py").is_file():
        raise SystemExit(f"--before {before_tree}: not a residency checkout (no residency/)")
    cache = REPO / ".cache" / "tiny-models"
    tokenizer = ensure_tokenizer(REPO / "residency" / "data", cache)
    model = build_tiny_model(DENSE_SPEC, cache / "dense", tokenizer)
    with tempfile.TemporaryDirectory(prefix="router-ab-") as name:
        tmp = Path(name)
        index_dir = tmp / "index"
        corpus = REPO / "residency" / "data" / "corpora" / "harbor-lights" / "docs"
        build_index(corpus, index_dir, IndexOptions(dense=False), LocalTokenizer(tokenizer), None)
        server = VllmServer(model, log_path=tmp / "vllm.log", extra_args=SERVER_ARGS).start()
        routers: list[ManagedServer] = []
        try:
            plan = tmp / "plan.json"
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "residency",
                    "plan",
                    "--server",
                    server.base_url,
                    "--platform",
                    "cpu",
                    "--index",
                    str(index_dir),
                    "-o",
                    str(plan),
                ],
                check=True,
                capture_output=True,
                cwd=REPO,
            )
            routers.append(_router(before_tree, plan, server.base_url, tmp, "before"))
            routers.append(_router(REPO, plan, server.base_url, tmp, "after"))
            builder = ContextBuilder(read_plan(plan), open_index(index_dir), ContextSettings())
            question = next(q for q in QUESTIONS if builder.retrieve(q).route == "resident")
            r = builder.retrieve(question)
            messages = assemble_messages(
                [{"role": "user", "content": question}],
                builder.plan.prefix.text,
                builder.render(r, r.chunk_ids),
            )
            direct_body = {"model": "tiny", "messages": messages, "max_tokens": 1}
            routed_body = {"messages": [{"role": "user", "content": question}], "max_tokens": 1}
            targets = {
                "direct": (f"{server.base_url}/v1/chat/completions", direct_body),
                "before": (f"{routers[0].url}/v1/chat/completions", routed_body),
                "after": (f"{routers[1].url}/v1/chat/completions", routed_body),
            }
            times: dict[str, list[float]] = {k: [] for k in targets}
            names = list(targets)
            with httpx.Client(timeout=120) as client:
                for _ in range(10):  # connections and caches warm on every path
                    for url, body in targets.values():
                        _post(client, url, body)
                for i in range(args.pairs):
                    order = names[i % 3 :] + names[: i % 3]
                    for key in order:
                        times[key].append(_post(client, *targets[key]))
        finally:
            for router in routers:
                router.stop()
            server.stop()
    figures: dict[str, Any] = {"machine": machine_info().describe(), "per_path": args.pairs}
    for key, values in times.items():
        figures[f"{key}_p50_ms"] = _pct(values, 0.50)
        figures[f"{key}_p95_ms"] = _pct(values, 0.95)
    for key in ("before", "after"):
        figures[f"{key}_overhead_p50_ms"] = figures[f"{key}_p50_ms"] - figures["direct_p50_ms"]
        figures[f"{key}_overhead_p95_ms"] = figures[f"{key}_p95_ms"] - figures["direct_p95_ms"]
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
