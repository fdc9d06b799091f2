"""Re-planning while serving (`residency serve --replan-every SECONDS`): the plan follows the
questions people ask now, not those of the log it was made from.

Every period the router reads the latest `--replan-window` questions of its own query log, makes
a plan from them exactly as `residency plan --log` would (`plan_from_log`, with the served
plan's capacity, strategy, prefix count and pins), and judges both plans on that window: the
share of its questions (by count) whose top chunk, through the live retriever, is resident —
the questions the plan answers from its prefix. Only a gain above `--replan-margin` swaps the
new plan in, through the reload path (validated, warmed and proven cached on every upstream
first, as on SIGHUP); plan.json is then rewritten, so a restart keeps it. Each decision is one
log line with both coverages. A stationary log keeps re-making the plan it already serves:
no gain, no swap.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import anyio
import orjson

from residency.errors import ConfigError, ResidencyError
from residency.index import Index
from residency.planning.plan_model import (
    LogFileSummary,
    PlanSettings,
    ResidencyPlan,
    write_plan,
)
from residency.planning.run import plan_from_log
from residency.query_log import LogEntry, LogRead, read_query_log
from residency.serve.agent_metrics import AgentMetrics
from residency.serve.context import _retriever
from residency.serve.reload import PlanReloader
from residency.serve.settings import RetrieverName, ServeSettings
from residency.tokenizer import ApproxTokenizer, LocalTokenizer, ModelTokenizer, ServerTokenizer

log = logging.getLogger("residency.serve")

MIN_WINDOW = 10  # fewer logged questions than this: nothing to judge a plan on yet


@dataclass(frozen=True, slots=True)
class Judgement:
    """One re-plan: the window, both plans' coverage of it, and the plan made from it."""

    questions: int
    current: float
    candidate: float
    plan: ResidencyPlan

    @property
    def gain(self) -> float:
        """Candidate minus current coverage."""
        return self.candidate - self.current


def read_window(path: Path, size: int) -> LogRead:
    """The latest `size` questions of a query log (file order: the order they were asked)."""
    read = read_query_log(path)
    return LogRead(entries=read.entries[-size:], skipped=())


def window_coverage(
    plan: ResidencyPlan, index: Index, retriever: RetrieverName, entries: Sequence[LogEntry]
) -> float:
    """Share of the entries (by count) whose top chunk through `retriever` is resident."""
    resident = plan.resident_chunk_ids()
    search = _retriever(index, retriever)
    total = covered = 0
    for entry in entries:
        hits = search.search(entry.query, 1)
        total += entry.count
        covered += entry.count if hits and hits[0].id in resident else 0
    return covered / total if total else 0.0


def encoder_of(plan: ResidencyPlan, upstream: str) -> ModelTokenizer:
    """The tokenizer the served plan was counted with: its directory, the upstream's own
    /tokenize (a plan made with --server), or the approximate rule."""
    label = plan.prefix.tokenizer
    if label.startswith("tokenizer:"):
        return LocalTokenizer(Path(label.removeprefix("tokenizer:")))
    if label.startswith("server:"):
        return ServerTokenizer(upstream)
    return ApproxTokenizer()


def replan(
    plan: ResidencyPlan, index: Index, settings: ServeSettings, window: LogRead, source: Path
) -> Judgement:
    """A plan from the window, judged against the served one (CPU-bound: run in a thread)."""
    stamps = [e.ts for e in window.entries if e.ts is not None]
    files = (
        LogFileSummary(
            path=str(source),
            entries=len(window.entries),
            total_count=window.total_count,
            skipped=0,
            first_ts=min(stamps) if stamps else None,
            last_ts=max(stamps) if stamps else None,
        ),
    )
    forced = plan.arithmetic is not None and plan.arithmetic.prefixes_chosen_by == "forced"
    plan_settings = PlanSettings(
        strategy=plan.strategy, prefixes=len(plan.all_prefixes()) if forced else None
    )
    pins = tuple(dict.fromkeys(i.section_id for i in plan.resident if i.pinned))
    candidate = plan_from_log(
        index,
        window,
        files,
        plan.capacity,
        encoder_of(plan, settings.upstreams[0]),
        plan_settings,
        pins,
    )
    entries = window.entries
    return Judgement(
        questions=window.total_count,
        current=window_coverage(plan, index, settings.retriever, entries),
        candidate=window_coverage(candidate, index, settings.retriever, entries),
        plan=candidate,
    )


class Replanner:
    """The re-plan loop beside the router: judge, and swap through the reload path."""

    def __init__(
        self,
        settings: ServeSettings,
        reloader: PlanReloader,
        metrics: AgentMetrics,
        log_path: Path,
    ) -> None:
        self._settings = settings
        self._agent = settings.agent
        self._reloader = reloader
        self._metrics = metrics
        self._log_path = log_path

    async def run(self) -> None:
        """Re-plan every --replan-every seconds until cancelled."""
        assert self._agent.replan_every_s is not None
        while True:
            await asyncio.sleep(self._agent.replan_every_s)
            await self.step()

    async def step(self) -> str:
        """One re-plan: 'swap', 'keep', 'refused', 'failed' or 'waiting' (too few questions)."""
        state = self._reloader.router.state
        try:
            window = await anyio.to_thread.run_sync(
                read_window, self._log_path, self._agent.replan_window
            )
        except ResidencyError as exc:
            log.info("re-plan: query log unreadable (%s); next try in %g s", exc,
                     self._agent.replan_every_s)  # fmt: skip
            return "waiting"
        if window.total_count < MIN_WINDOW:
            return "waiting"
        plan, index = state.builder.plan, state.builder.index
        try:
            judged = await anyio.to_thread.run_sync(
                replan, plan, index, self._settings, window, self._log_path
            )
        except Exception as exc:  # a plan that cannot be made leaves the served one alone
            why = str(exc) if isinstance(exc, ResidencyError) else f"{type(exc).__name__}: {exc}"
            log.error("re-plan failed: %s; still serving plan %s", why, state.short_sha)
            self._metrics.replans.labels("failed").inc()
            return "failed"
        m = self._metrics
        m.replan_window.set(judged.questions)
        m.replan_coverage.labels("current").set(judged.current)
        m.replan_coverage.labels("candidate").set(judged.candidate)
        said = (
            f"re-plan over the last {judged.questions} questions: plan {state.short_sha} covers "
            f"{judged.current:.3f}, the plan made from them {judged.candidate:.3f} "
            f"({judged.gain:+.3f}, margin {self._agent.replan_margin:.3f})"
        )
        if judged.gain <= self._agent.replan_margin:
            log.info("%s: keeping plan %s", said, state.short_sha)
            m.replans.labels("keep").inc()
            return "keep"
        log.info("%s: swapping it in", said)
        data = orjson.dumps(judged.plan.model_dump(mode="json"), option=orjson.OPT_INDENT_2)
        result = await self._reloader.reload("re-plan", data + b"\n")
        if result != "ok":
            m.replans.labels("refused").inc()
            return "refused"
        try:
            await anyio.to_thread.run_sync(write_plan, judged.plan, self._settings.plan)
            self._reloader.written()
        except OSError as exc:
            log.warning("re-plan: serving the new plan, but --plan %s was not rewritten (%s)",
                        self._settings.plan, exc.strerror)  # fmt: skip
        m.replans.labels("swap").inc()
        return "swap"


def check_replan(settings: ServeSettings) -> None:
    """--replan-every reads the router's own query log: refuse it without one."""
    if settings.agent.replan_every_s is not None and settings.log is None:
        raise ConfigError("--replan-every re-plans from the query log: drop --no-log")
