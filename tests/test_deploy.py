"""deploy/: the Prometheus alerting rules pass `promtool check rules`, and every metric the
Grafana dashboard and the rules query is one a live router exports (a real `residency serve`
process with the recall canary on, scraped at /metrics)."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from residency_cli import run_cli
from router_server import RouterProcess
from vllm_server import REPO_ROOT

from residency.corpus.samples import JA_SAMPLE
from residency.index import IndexOptions, build_index
from residency.tokenizer import LocalTokenizer

RULES = REPO_ROOT / "deploy" / "prometheus" / "residency-alerts.yml"
DASHBOARD = REPO_ROOT / "deploy" / "grafana" / "residency-dashboard.json"
NAME = re.compile(r"\b(residency_[a-z0-9_]+)\b")


def dashboard_exprs() -> list[str]:
    panels = json.loads(DASHBOARD.read_text("utf-8"))["panels"]
    return [t["expr"] for p in panels for t in p.get("targets", ())]


def rule_exprs() -> list[str]:
    import yaml

    groups = yaml.safe_load(RULES.read_text("utf-8"))["groups"]
    return [str(r["expr"]) for g in groups for r in g["rules"]]


def test_promtool_accepts_the_alerting_rules() -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is missing: `CI=1 make install` installs Debian's prometheus package")
    done = subprocess.run(
        [promtool, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_the_dashboard_covers_what_the_issue_asks_for() -> None:
    titles = " | ".join(p["title"] for p in json.loads(DASHBOARD.read_text("utf-8"))["panels"])
    for words in (
        "residency",
        "Hit rate per route",
        "TTFT saved",
        "Evictions and re-warms",
        "Recall canary",
        "Upstream",
    ):
        assert words.lower() in titles.lower(), words
    assert len(dashboard_exprs()) >= 15


@pytest.fixture(scope="module")
def live_router(
    tmp_path_factory: pytest.TempPathFactory, tiny_tokenizer_dir: Path
) -> Iterator[RouterProcess]:
    """A router on an offline plan of the Japanese sample, its upstream a closed port, the
    recall canary on the sample's labelled questions."""
    root = tmp_path_factory.mktemp("deploy")
    build_index(
        JA_SAMPLE.docs,
        root / "index",
        IndexOptions(dense=False),
        LocalTokenizer(tiny_tokenizer_dir),
        None,
    )
    plan = root / "plan.json"
    done = run_cli(
        "plan", "--index", str(root / "index"), "--max-model-len", "8192", "-o", str(plan)
    )
    assert done.returncode == 0, done.stderr
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        args = (
            "--no-warm",
            "--retriever",
            "bm25",
            "--canary",
            str(JA_SAMPLE.questions),
            "--replan-every",
            "3600",
        )
        upstream = f"http://127.0.0.1:{s.getsockname()[1]}"
        with RouterProcess(plan, [upstream], root, args).start(require_healthy=False) as router:
            yield router


def exported(router: RouterProcess) -> set[str]:
    """Every series name the router's /metrics can produce (families and their suffixes)."""
    deadline = time.monotonic() + 120
    while True:  # the canary's first run sets its gauges
        text = httpx.get(f"{router.base_url}/metrics", timeout=30).text
        if re.search(r"^residency_recall_ok \d", text, re.M):
            break
        assert time.monotonic() < deadline, "timed out waiting for the canary's first run"
        time.sleep(0.2)
    names: set[str] = set()
    for line in text.splitlines():
        m = re.match(r"# TYPE (\S+) (\S+)", line)
        if not m:
            continue
        name, kind = m.groups()
        if kind == "counter":
            names |= {name, name.removesuffix("_total") + "_total"}
        elif kind == "histogram":
            names |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
        else:
            names.add(name)
    return names


@pytest.mark.parametrize("source", ["dashboard", "rules"])
def test_every_metric_queried_is_exported_by_a_live_router(
    live_router: RouterProcess, source: str
) -> None:
    exprs = dashboard_exprs() if source == "dashboard" else rule_exprs()
    queried = {n for e in exprs for n in NAME.findall(e)}
    assert len(queried) >= (20 if source == "dashboard" else 8)
    missing = sorted(queried - exported(live_router))
    assert missing == []


def test_the_probes_use_ready_for_readiness_and_health_for_liveness() -> None:
    import yaml

    from residency.serve.app import OPEN_PATHS, READY

    manifest = REPO_ROOT / "deploy" / "kubernetes" / "residency-router.yaml"
    docs = [d for d in yaml.safe_load_all(manifest.read_text("utf-8")) if d]
    pod = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]
    router = next(c for c in pod["containers"] if c["name"] == "router")
    assert router["readinessProbe"]["httpGet"]["path"] == READY == "/ready"
    assert router["livenessProbe"]["httpGet"]["path"] == "/health"
    assert {READY, "/health"} <= OPEN_PATHS  # probes carry no API key
    compose = yaml.safe_load((REPO_ROOT / "deploy" / "scale-out" / "compose.yaml").read_text())
    assert "/ready" in " ".join(compose["x-router"]["healthcheck"]["test"])
    assert compose["services"]["lb"]["depends_on"]["router-a"]["condition"] == "service_healthy"
