"""The query log: one JSON object per line, appended by the router, read by the planner.

A line needs `query`; `count` (default 1) and `ts` are optional, and the router's extra fields
(route, retrieved ids, cached tokens, timings) are kept out of the planner's way. Reading skips
bad lines and reports each one with its line number: a log written by a crashed process may end
in a torn line, and earlier lines must still count.
"""

from __future__ import annotations

import datetime as dt
import errno
import glob
import os
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from residency.atomic import append_line
from residency.errors import ConfigError, CorpusError


class LogEntry(BaseModel):
    """One logged question (extra router fields are ignored when reading)."""

    model_config = ConfigDict(frozen=True, extra="ignore", defer_build=True)

    query: str = Field(min_length=1, max_length=100_000, description="The user's question.")
    count: int = Field(default=1, ge=1, le=10**9, description="Times this question was asked.")
    ts: dt.datetime | None = Field(default=None, description="When it was (last) asked.")


class LogRead(BaseModel):
    """The usable entries of a log and the lines that were skipped."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    entries: tuple[LogEntry, ...] = Field(description="Parsed entries, in file order.")
    skipped: tuple[str, ...] = Field(description="'file:line: reason' for every skipped line.")

    @property
    def total_count(self) -> int:
        """Questions in the log, counting repeats."""
        return sum(e.count for e in self.entries)


def read_query_log(path: Path) -> LogRead:
    """Parse a query log; a missing file, or one without a single valid line, is a
    `CorpusError`; bad lines among good ones (a router killed mid-write) are listed as skipped."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise CorpusError(f"--log {path}: cannot read it ({exc.strerror})") from None
    entries: list[LogEntry] = []
    skipped: list[str] = []
    for number, line in enumerate(raw.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            entries.append(LogEntry.model_validate(orjson.loads(line)))
        except orjson.JSONDecodeError:
            skipped.append(f"{path}:{number}: not valid JSON")
        except ValidationError as exc:
            err = exc.errors()[0]
            skipped.append(f"{path}:{number}: {'.'.join(map(str, err['loc']))}: {err['msg']}")
    if skipped and not entries:  # not one line of it is a logged question: not a query log
        raise CorpusError(
            f"--log {path}: not a query log (no line holds a question: {skipped[0]}); the router "
            "writes one (`residency serve --log`), one JSON object per line with query, count, ts"
        )
    return LogRead(entries=tuple(entries), skipped=tuple(skipped))


TAIL_BLOCK_BYTES = 1 << 20  # read backwards this much at a time
MAX_LINE_BYTES = 4 << 20  # a longer line is no router record (its query is capped): skipped


def lines_from_end(path: Path, max_lines: int) -> Iterator[bytes]:
    """The file's non-empty lines, last first, at most `max_lines`, read backwards a block at
    a time: a re-plan over the latest questions reads those, not the whole log. The first
    line yielded may be torn (a writer mid-append); its reader skips it as it skips any bad
    line."""
    with path.open("rb") as f:
        end = f.seek(0, os.SEEK_END)
        rest = b""
        given = 0
        while end > 0:
            start = max(0, end - TAIL_BLOCK_BYTES)
            f.seek(start)
            block = f.read(end - start) + rest
            end = start
            lines = block.split(b"\n")
            rest = lines.pop(0) if start > 0 else b""
            if len(rest) > MAX_LINE_BYTES:
                rest = b"\xff"  # not JSON: the overlong line is skipped, memory stays bounded
            for line in reversed(lines):
                if line.strip():
                    yield line
                    given += 1
                    if given >= max_lines:
                        return


def expand_log_patterns(patterns: Sequence[str]) -> list[Path]:
    """Each ``--log`` as a file or a glob (``logs/router-*.jsonl``), in order, each file once.

    A literal path that does not exist, or a glob that matches nothing, is a ConfigError: a
    replica's log silently missing from a plan is what merging many logs must not do.
    """
    out: dict[Path, Path] = {}
    for pattern in patterns:
        if glob.has_magic(pattern):
            matched = sorted(Path(p) for p in glob.glob(pattern, recursive=True))
            matched = [p for p in matched if p.is_file()]
            if not matched:
                raise ConfigError(f"--log {pattern!r} matches no file")
        else:
            if not Path(pattern).is_file():
                raise ConfigError(f"--log {pattern}: no such file")
            matched = [Path(pattern)]
        for path in matched:
            out.setdefault(path.resolve(), path)
    return list(out.values())


def _when(entry: LogEntry) -> tuple[bool, dt.datetime]:
    """Sort key: dated entries first by UTC time (naive = UTC), undated after, in file order."""
    if entry.ts is None:
        return True, dt.datetime.min.replace(tzinfo=dt.UTC)
    ts = entry.ts if entry.ts.tzinfo is not None else entry.ts.replace(tzinfo=dt.UTC)
    return False, ts


def merge_by_time(reads: Sequence[LogRead]) -> LogRead:
    """Several logs as one, ordered by timestamp (a stable sort: ties keep --log order)."""
    entries = [e for r in reads for e in r.entries]
    entries.sort(key=_when)
    return LogRead(entries=tuple(entries), skipped=tuple(s for r in reads for s in r.skipped))


def append_log_record(path: Path, record: BaseModel) -> None:
    """Append one record as a single line (O_APPEND: concurrent writers never interleave)."""
    append_line(path, orjson.dumps(record.model_dump(mode="json", exclude_none=True)))


class QueryLogWriter:
    """The router's open query log: one O_APPEND write per line, fsync batched, following the
    path through log rotation.

    A single `write` on an O_APPEND descriptor is atomic with respect to other appenders, so
    lines never interleave; a crash can lose at most the lines since the last `sync` (the OS
    still holds them unless the machine itself goes down) and never corrupts earlier ones.
    Syncing every line would put a disk flush (milliseconds) on every request's path.

    Rotation: `follow` (one `stat` per line) reopens the path when the file there is no longer
    the one held open (renamed or deleted, then created anew by logrotate or by this writer),
    so no line goes to a rotated or deleted file after the rotation is done; `reopen` does it
    on demand (SIGHUP, SIGUSR1). A file truncated in place (logrotate's copytruncate) keeps
    its inode: O_APPEND writes go on at its new end, with no hole.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()  # `sync` runs in a worker thread; `reopen` swaps the fd
        self._dirty = False
        try:
            self._fd, self._id = self._open()
        except OSError as exc:
            raise CorpusError(
                f"--log {path}: cannot open it for appending ({exc.strerror})"
            ) from None

    def _open(self) -> tuple[int, tuple[int, int]]:
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            st = os.fstat(fd)
            if self._end_torn_line(fd, st.st_size):
                self._dirty = True
        except OSError:
            os.close(fd)
            raise
        return fd, (st.st_dev, st.st_ino)

    @staticmethod
    def _end_torn_line(fd: int, size: int) -> bool:
        """A log whose last line lacks its newline (a crash mid-write, another writer's torn
        line) gets one, so the first new record starts a line of its own instead of being
        glued to the torn one and lost with it. True when it wrote one."""
        if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
            return False
        os.write(fd, b"\n")
        return True

    def follow(self) -> Literal["same", "replaced", "vanished"]:
        """Reopen the path if the file open is no longer there: 'vanished' (nothing at the
        path: a new file is created), 'replaced' (another file is), else 'same'."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            self.reopen()
            return "vanished"
        if (st.st_dev, st.st_ino) == self._id:
            return "same"
        self.reopen()
        return "replaced"

    def reopen(self) -> None:
        """Open the path anew (creating it when missing) and close the old descriptor."""
        fd, file_id = self._open()
        with self._lock:
            old, self._fd, self._id = self._fd, fd, file_id
            os.close(old)

    def append(self, record: BaseModel) -> None:
        """Write one record as one line."""
        data = orjson.dumps(record.model_dump(mode="json", exclude_none=True)) + b"\n"
        written = os.write(self._fd, data)
        if written != len(data):  # pragma: no cover - only a full disk gets here
            raise OSError(errno.ENOSPC, f"short append to {self.path}")
        self._dirty = True

    def sync(self) -> None:
        """fsync what was appended since the last sync (on a duplicate of the descriptor, so
        a `reopen` meanwhile cannot close it under the flush)."""
        with self._lock:
            if not self._dirty:
                return
            fd = os.dup(self._fd)
            self._dirty = False
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def close(self) -> None:
        """Sync and close."""
        self.sync()
        with self._lock:
            os.close(self._fd)
