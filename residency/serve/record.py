"""The router's query-log line: what `residency plan --log` reads (query, count, ts) plus what
happened to the request (route, retrieved ids, cached tokens, timings); and the file the lines
go to, followed through log rotation, its lines and reopenings counted."""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from starlette.types import Scope

from residency.query_log import QueryLogWriter
from residency.serve.telemetry import RouterMetrics

log = logging.getLogger("residency.serve")

Outcome = Literal["ok", "upstream_error", "client_error", "disconnected", "unavailable"]


class RouterLogRecord(BaseModel):
    """One request, one line (appended atomically; see residency.query_log)."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    query: str = Field(min_length=1, description="The question (last user message).")
    count: int = Field(default=1, ge=1, description="Always 1: one line per request.")
    ts: dt.datetime = Field(description="Arrival time (UTC).")
    endpoint: Literal["chat", "completions"] = Field(description="Which API was called.")
    route: str = Field(description="resident, long_tail or dated.")
    prefix: str | None = Field(
        default=None, max_length=64, description="The resident prefix it went out with."
    )
    retrieved: tuple[str, ...] = Field(description="Section ids added after the prefix.")
    chunks: tuple[str, ...] = Field(description="Long-tail chunk ids added, prompt order.")
    top_chunk: str | None = Field(default=None, description="The best-ranked chunk overall.")
    period: str | None = Field(default=None, description="Resolved time period, if any.")
    pruned: int | None = Field(default=None, ge=0, description="Chunks the pruner dropped.")
    pruner_valid: bool | None = Field(default=None, description="Pruner answer was valid.")
    upstream: str | None = Field(default=None, description="Upstream position that served it.")
    outcome: Outcome = Field(description="How the request ended.")
    source: str | None = Field(
        default=None,
        max_length=32,
        description="Who asked: a hash of the API key sent, else of the client's address "
        "(re-planning counts at most a share of its window per source).",
    )
    status_code: int = Field(ge=100, le=599, description="HTTP status sent to the client.")
    prompt_tokens: int | None = Field(default=None, ge=0, description="usage.prompt_tokens.")
    cached_tokens: int | None = Field(
        default=None, ge=0, description="usage.prompt_tokens_details.cached_tokens."
    )
    completion_tokens: int | None = Field(default=None, ge=0, description="Generated tokens.")
    retrieval_ms: float = Field(ge=0, description="Retrieval + routing + time expressions.")
    prune_ms: float | None = Field(default=None, ge=0, description="Pruner call.")
    forward_ms: float | None = Field(
        default=None,
        ge=0,
        description="Arrival to the request handed to the upstream: the router's own work "
        "(parse, retrieval, routing, assembly).",
    )
    ttft_ms: float | None = Field(default=None, ge=0, description="Arrival to first event.")
    total_ms: float = Field(ge=0, description="Arrival to the last byte.")


def source_of(scope: Scope) -> str:
    """A request's source for the query log: 'key:' and 12 hex digits of the sha256 of its
    bearer token, else 'addr:' and those of the client's address (neither is stored)."""
    header = dict(scope.get("headers") or []).get(b"authorization", b"")
    if header[:7].lower() == b"bearer " and header[7:].strip():
        return "key:" + hashlib.sha256(header[7:].strip()).hexdigest()[:12]
    client = scope.get("client")
    host = str(client[0]) if client else "unknown"
    return "addr:" + hashlib.sha256(host.encode()).hexdigest()[:12]


class RouterQueryLog:
    """The query log at --log: an append per request that never fails the answer (an error is
    one log line), following the path through rotation, reopened on a signal."""

    def __init__(self, path: Path, metrics: RouterMetrics) -> None:
        self.writer = QueryLogWriter(path)
        self.metrics = metrics

    @property
    def path(self) -> Path:
        """The file's path (--log)."""
        return self.writer.path

    def append(self, record: RouterLogRecord) -> None:
        """Append one line to the file now at --log (reopening it first if it was rotated)."""
        try:
            moved = self.writer.follow()
            if moved != "same":
                self.metrics.query_log_reopens.labels(moved).inc()
                if moved == "vanished":
                    log.warning(
                        "query log %s vanished (renamed or deleted); writing to a new file there",
                        self.path,
                    )
                else:
                    log.info("query log %s was replaced (rotated); reopened it", self.path)
            self.writer.append(record)
        except OSError as exc:  # a full disk must not fail the answer already sent
            log.error("query log %s: cannot append (%s)", self.path, exc.strerror)
            return
        self.metrics.query_log_lines.inc()

    def reopen(self, trigger: str) -> None:
        """Open the path anew (SIGHUP, SIGUSR1: logrotate's postrotate)."""
        try:
            self.writer.reopen()
        except OSError as exc:
            log.error("query log %s: cannot reopen it (%s)", self.path, exc.strerror)
            return
        self.metrics.query_log_reopens.labels(trigger).inc()
        log.info("query log %s reopened (%s)", self.path, trigger)

    def sync(self) -> None:
        """fsync what was appended since the last sync."""
        try:
            self.writer.sync()
        except OSError as exc:
            log.error("query log %s: cannot sync (%s)", self.path, exc.strerror)

    def close(self) -> None:
        """Sync and close."""
        self.sync()
        self.writer.close()
