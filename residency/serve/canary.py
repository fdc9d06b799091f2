"""The recall canary: a small labelled set run through the router's live retriever on a
schedule and whenever the plan or index being served changes, exported as gauges.

Retrieval quality can fall while every other signal is green (latency flat, no errors): an
index rebuilt with another embedder or tokenizer, BM25 files of another build, a corpus edit
that moved sections. The canary measures what `residency eval retrieval` measures (section-level
recall@k and MRR@10, residency/retrieval/metrics.py) through the very retriever the router
searches with, so such a change shows within one `--canary-every` period; a plan or index swap
is checked at once. Below `--min-recall` the router logs a warning and `residency_recall_ok`
reads 0 until a run is back above the floor.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import anyio
import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from residency.context.builder import ContextBuilder
from residency.errors import ConfigError
from residency.keep.agent_metrics import AgentMetrics
from residency.retrieval.metrics import K_VALUES, question_metrics
from residency.serve.agent_settings import AgentSettings, floor_of
from residency.serve.state import ServingState

log = logging.getLogger("residency.serve")

CHECK_S = 0.5  # how often the loop looks for a plan swap or a new labelled file
# A labelled set is a few hundred questions (the English sample's 65 are 14 KB); a file past
# this is refused by its size, unread.
MAX_CANARY_BYTES = 16 * 1024 * 1024
MAX_K = max(K_VALUES)


class CanaryQuestion(BaseModel):
    """One labelled line (the `eval retrieval` questions format; other fields are ignored)."""

    model_config = ConfigDict(frozen=True, extra="ignore", defer_build=True)

    query: str = Field(min_length=1, max_length=100_000, description="The question.")
    relevant_ids: tuple[str, ...] = Field(
        max_length=10_000, description="Gold section ids; empty: left out of the canary."
    )


@dataclass(frozen=True, slots=True)
class CanaryResult:
    """One run's means over the labelled questions."""

    questions: int
    metrics: dict[str, float]  # recall_at_1 ... recall_at_10, mrr_at_10, ndcg_at_10


def read_canary(path: Path) -> list[CanaryQuestion]:
    """The answerable questions of a labelled jsonl file; `ConfigError` names a bad line, or
    the size limit for a file past it."""
    try:
        size = path.stat().st_size
        if size > MAX_CANARY_BYTES:
            raise ConfigError(
                f"--canary {path}: {size} bytes, over the {MAX_CANARY_BYTES}-byte limit of a "
                "labelled set; keep a sample of the questions in it"
            )
        lines = path.read_bytes().splitlines()
    except OSError as exc:
        raise ConfigError(f"--canary {path}: cannot read it ({exc.strerror})") from None
    out: list[CanaryQuestion] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            question = CanaryQuestion.model_validate(orjson.loads(line))
        except (orjson.JSONDecodeError, ValidationError) as exc:
            why = str(exc).splitlines()[0]
            raise ConfigError(f"--canary {path}:{number}: {why}") from None
        if question.relevant_ids:
            out.append(question)
    if not out:
        raise ConfigError(f"--canary {path} holds no question with relevant_ids")
    return out


def evaluate_canary(builder: ContextBuilder, questions: Sequence[CanaryQuestion]) -> CanaryResult:
    """Mean section-level metrics of the questions through the builder's retriever (the one
    the router searches with: --retriever over the served index)."""
    index = builder.index
    retriever = builder.retriever
    fetch = max(builder.settings.routing.prefetch, MAX_K)
    rows = []
    for q in questions:
        hits = retriever.search(q.query, fetch)
        ranked = list(dict.fromkeys(index.section_of(h.id) for h in hits))[:MAX_K]
        rows.append(question_metrics(ranked, q.relevant_ids))
    means = {f: sum(r[f] for r in rows) / len(rows) for f in rows[0]} if rows else {}
    return CanaryResult(len(rows), means)


class RecallCanary:
    """Runs the canary on start, on every serving-state swap, when the labelled file changes
    and every `canary_every_s`; sets the gauges and `residency_recall_ok`."""

    def __init__(
        self, settings: AgentSettings, metrics: AgentMetrics, state: Callable[[], ServingState]
    ) -> None:
        assert settings.canary is not None
        self._path = settings.canary
        self._every_s = settings.canary_every_s
        self._field, self._floor = floor_of(settings.min_recall)
        self._label = settings.min_recall.split("=")[0].strip().upper()
        self._metrics = metrics
        self._state = state
        self._questions: list[CanaryQuestion] = []
        self._mtime: int | None = None
        # After a failed read: the next try waits twice as long each time, up to the period,
        # and the failure is reported once (then again only after a good read).
        self._backoff_s = 0.0
        self._retry_at = 0.0
        self.ok: bool | None = None
        metrics.recall_floor.set(self._floor)

    async def run(self) -> None:
        """Loop until cancelled."""
        served: ServingState | None = None
        due = 0.0
        while True:
            state = self._state()
            mtime = _mtime(self._path)
            trigger = None
            if served is None:
                trigger = "start"
            elif state is not served:
                trigger = "plan"
            elif mtime != self._mtime and time.monotonic() >= self._retry_at:
                trigger = "set"
            elif time.monotonic() >= max(due, self._retry_at):
                trigger = "schedule"
            if trigger is not None:
                served = state
                due = time.monotonic() + self._every_s
                await self.run_once(state, trigger)
            await asyncio.sleep(CHECK_S)

    async def run_once(self, state: ServingState, trigger: str) -> CanaryResult | None:
        """One evaluation; None (logged, counted as failed) when the set or the retriever fails."""
        mtime = _mtime(self._path)
        if mtime != self._mtime or not self._questions:
            if time.monotonic() < self._retry_at and self._questions:
                pass  # backing off: the previous set stands
            elif not await self._read(mtime, trigger) and not self._questions:
                self._metrics.canary_runs.labels("failed").inc()
                self._set_ok(False)
                return None
        try:
            result = await anyio.to_thread.run_sync(evaluate_canary, state.builder, self._questions)
        except Exception as exc:  # a broken index may raise anything: the canary says so
            log.error("recall canary (%s) failed: %s: %s", trigger, type(exc).__name__, exc)
            self._metrics.canary_runs.labels("failed").inc()
            self._set_ok(False)
            return None
        self._publish(result, trigger, state)
        return result

    async def _read(self, mtime: int | None, trigger: str) -> bool:
        """Read the labelled set; on failure back off and say so once (True: read)."""
        try:
            questions = await anyio.to_thread.run_sync(read_canary, self._path)
            self._metrics.set_canary_file_time(self._path.stat().st_mtime)
        except (ConfigError, OSError) as exc:
            if self._backoff_s == 0.0:
                keep = "; the previous set stands" if self._questions else ""
                log.error(
                    "recall canary (%s): labelled set unreadable: %s%s; retrying with "
                    "back-off up to --canary-every",
                    trigger,
                    exc,
                    keep,
                )
            self._backoff_s = min(max(2 * self._backoff_s, 2 * CHECK_S), self._every_s)
            self._retry_at = time.monotonic() + self._backoff_s
            return False
        if self._backoff_s:
            log.info("recall canary: labelled set %s readable again", self._path)
        self._questions, self._mtime = questions, mtime
        self._backoff_s = self._retry_at = 0.0
        return True

    def _publish(self, result: CanaryResult, trigger: str, state: ServingState) -> None:
        m = self._metrics
        for k in K_VALUES:
            m.recall.labels(str(k)).set(result.metrics[f"recall_at_{k}"])
        m.mrr.set(result.metrics["mrr_at_10"])
        m.canary_questions.set(result.questions)
        m.canary_last.set(time.time())
        m.canary_runs.labels(trigger).inc()
        value = result.metrics[self._field]
        ok = value >= self._floor
        summary = (
            f"{self._label} {value:.3f} (floor {self._floor:.2f}), R@10 "
            f"{result.metrics['recall_at_10']:.3f}, MRR@10 {result.metrics['mrr_at_10']:.3f} "
            f"over {result.questions} questions; plan {state.short_sha}"
        )
        if ok:
            log.info("recall canary (%s): %s", trigger, summary)
        else:
            log.warning("recall canary (%s): BELOW --min-recall: %s", trigger, summary)
        self._set_ok(ok)

    def _set_ok(self, ok: bool) -> None:
        self.ok = ok
        self._metrics.recall_ok.set(1 if ok else 0)


def _mtime(path: Path) -> int | None:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return None
