"""Progress of long library phases (`BuildProgress`) on stderr: a bar on a terminal, and off a
terminal (a log, CI, `| tee`) one line at most every `LOG_INTERVAL_S` with done/total, rate and
time left, so a long `index` or `plan` is never silent until it ends."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
)


class BarProgress:
    """`residency.index.BuildProgress` drawn on a rich `Progress` (one bar per phase)."""

    def __init__(self, bar: Progress) -> None:
        self._bar = bar
        self._task: TaskID | None = None

    def start(self, description: str, total: int) -> None:
        """Begin a new bar (the previous one stays, completed)."""
        self._task = self._bar.add_task(description, total=total)

    def advance(self, steps: int) -> None:
        """Move the current bar."""
        if self._task is not None:
            self._bar.advance(self._task, steps)


def progress_bar(
    json: bool, *, transient: bool = True, eta: bool = False, terminal_only: bool = True
) -> Progress:
    """A bar on stderr (description, bar, done/total, and the time left with `eta`), hidden
    under --json and, with `terminal_only`, when stderr is not a terminal."""
    err = Console(stderr=True)
    columns: list[ProgressColumn] = [
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
    ]
    if eta:
        columns.append(TimeRemainingColumn())
    return Progress(
        *columns,
        console=err,
        transient=transient,
        disable=json or (terminal_only and not err.is_terminal),
    )


LOG_INTERVAL_S = 10.0


def _duration(seconds: float) -> str:
    """'7m02s', '45s', '1h03m'."""
    whole = round(seconds)
    if whole >= 3600:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    if whole >= 60:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole}s"


class LogProgress:
    """`BuildProgress` as log lines: one when a phase starts, then at most one per `interval_s`
    ('embedding passages: 120/1,431 (8%), 3.1/s, ETA 7m02s'), and one when it ends."""

    def __init__(
        self,
        write: Callable[[str], None],
        interval_s: float = LOG_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._write = write
        self._interval_s = interval_s
        self._clock = clock
        self._description = ""
        self._total = 0
        self._done = 0
        self._started = 0.0
        self._last = 0.0

    def start(self, description: str, total: int) -> None:
        """A phase of `total` steps begins (said at once)."""
        self._description, self._total, self._done = description, total, 0
        self._started = self._last = self._clock()
        self._write(f"{description}: 0/{total:,}")

    def advance(self, steps: int) -> None:
        """`steps` more are done; a line if `interval_s` passed since the last, or at the end."""
        self._done += steps
        now = self._clock()
        elapsed = now - self._started
        if self._done >= self._total > 0:
            self._write(
                f"{self._description}: {self._total:,}/{self._total:,} done in {_duration(elapsed)}"
            )
            self._total = 0  # said once
            return
        if now - self._last < self._interval_s or self._total <= 0:
            return
        self._last = now
        rate = self._done / elapsed if elapsed > 0 else 0.0
        eta = f", ETA {_duration((self._total - self._done) / rate)}" if rate > 0 else ""
        self._write(
            f"{self._description}: {self._done:,}/{self._total:,} "
            f"({self._done / self._total:.0%}), {rate:.1f}/s{eta}"
        )


@contextmanager
def build_progress(json: bool = False, *, eta: bool = True) -> Iterator[BarProgress | LogProgress]:
    """A bar on a terminal (hidden under --json), log lines on stderr elsewhere."""
    err = Console(stderr=True)
    if err.is_terminal:
        with progress_bar(json, transient=False, eta=eta) as bar:
            yield BarProgress(bar)
        return

    def write(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    yield LogProgress(write)
