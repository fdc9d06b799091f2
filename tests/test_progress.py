"""Progress off a terminal: log lines at most every 10 s with done/total, rate and time left."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from residency.cli.progress import LogProgress


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_lines_at_most_every_interval_with_rate_and_eta() -> None:
    lines: list[str] = []
    clock = _Clock()
    progress = LogProgress(lines.append, interval_s=10.0, clock=clock)
    progress.start("embedding passages", 1431)
    for _ in range(30):  # 30 steps of 4, one per 2 s: a line every 10 s, never more often
        clock.now += 2.0
        progress.advance(4)
    assert lines[0] == "embedding passages: 0/1,431"
    assert lines[1] == "embedding passages: 20/1,431 (1%), 2.0/s, ETA 11m46s"
    assert len(lines) == 1 + 6
    clock.now += 60
    progress.advance(1431 - 120)
    assert lines[-1] == "embedding passages: 1,431/1,431 done in 2m00s"
    progress.advance(1)  # past the end: nothing more is said
    assert lines[-1] == "embedding passages: 1,431/1,431 done in 2m00s"


def test_index_off_a_terminal_logs_its_phases(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for n in range(3):
        (corpus / f"doc{n}.md").write_text(f"# Doc {n}\n\nSome text about lights {n}.\n")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "residency",
            "index",
            str(corpus),
            "-o",
            str(tmp_path / "i"),
            "--no-dense",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    # stderr is a pipe here, not a terminal: plain lines, no bar.
    lines = done.stderr.splitlines()
    assert "reading corpus files: 0/3" in lines, lines
    assert any(line.startswith("reading corpus files: 3/3 done in ") for line in lines), lines
    assert "\x1b[" not in done.stderr
