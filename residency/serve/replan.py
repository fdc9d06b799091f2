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
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import anyio
import orjson
from pydantic import ValidationError

from residency.context.retriever import chunk_retriever
from residency.context.settings import RetrieverName
from residency.errors import ConfigError, CorpusError, ResidencyError
from residency.index import Index
from residency.keep.agent_metrics import AgentMetrics
from residency.planning.plan_model import (
    LogFileSummary,
    PlanSettings,
    ResidencyPlan,
    write_plan,
)
from residency.planning.run import plan_from_log
from residency.query_log import LogEntry, LogRead, lines_from_end
from residency.serve.canary import read_canary
from residency.serve.reload import PlanReloader
from residency.serve.settings import ServeSettings
from residency.tokenizer import ApproxTokenizer, LocalTokenizer, ModelTokenizer, ServerTokenizer

log = logging.getLogger("residency.serve")

MIN_WINDOW = 10  # fewer logged questions than this: nothing to judge a plan on yet
# Every 4th question of the window is held back: the new plan is made from the other three
# quarters and must gain on that quarter too (a plan fitted to its own questions gains on them
# whatever they are).
HOLD_BACK_EVERY = 4
SCAN_FACTOR = 20  # lines read from the log's end at most, per question of the window


@dataclass(frozen=True, slots=True)
class Judgement:
    """One re-plan: the window, both plans' coverage of it and of its held-back part (the
    questions the new plan was not made from), of the canary's questions where one is set,
    and the plan made from the rest of the window."""

    questions: int
    current: float
    candidate: float
    plan: ResidencyPlan
    held_current: float = 0.0
    held_candidate: float = 0.0
    canary_current: float | None = None
    canary_candidate: float | None = None

    @property
    def gain(self) -> float:
        """Candidate minus current coverage."""
        return self.candidate - self.current

    @property
    def held_gain(self) -> float:
        """Candidate minus current coverage of the held-back questions."""
        return self.held_candidate - self.held_current

    def swap(self, margin: float) -> bool:
        """The new plan gains more than `margin` on the window and on its held-back part, and
        loses no more than `margin` on the canary's labelled questions (where there are)."""
        canary_ok = (
            self.canary_current is None
            or self.canary_candidate is None
            or self.canary_candidate >= self.canary_current - margin
        )
        return self.gain > margin and self.held_gain > margin and canary_ok


def read_window(path: Path, size: int, source_share: float = 1.0) -> LogRead:
    """The latest `size` answered questions of a query log, read from its end (file order:
    the order they were asked). A line counts only when its request was answered (`outcome`
    ok, or no outcome: a log not written by the router); a source (`source`: API key or client
    address) counts at most `source_share` of the window, each question of it once. At most
    SCAN_FACTOR * size lines are read, so a log of refused requests costs a bounded read."""
    cap = max(1, int(size * source_share))
    per_source: dict[str, int] = {}
    seen: set[tuple[str, str]] = set()
    newest_first: list[LogEntry] = []
    try:
        for line in lines_from_end(path, size * SCAN_FACTOR):
            entry, source = _answered(line)
            if entry is None:
                continue
            if source is not None:
                if (source, entry.query) in seen or per_source.get(source, 0) >= cap:
                    continue
                seen.add((source, entry.query))
                per_source[source] = per_source.get(source, 0) + 1
            newest_first.append(entry)
            if len(newest_first) >= size:
                break
    except OSError as exc:
        raise CorpusError(f"--log {path}: cannot read it ({exc.strerror})") from None
    return LogRead(entries=tuple(reversed(newest_first)), skipped=())


def _answered(line: bytes) -> tuple[LogEntry | None, str | None]:
    """The line's question and source, when it is one and its request was answered."""
    try:
        raw = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None, None
    if not isinstance(raw, dict) or raw.get("outcome", "ok") != "ok":
        return None, None
    try:
        entry = LogEntry.model_validate(raw)
    except ValidationError:
        return None, None
    source = raw.get("source")
    return entry, source if isinstance(source, str) else None


def top_chunks(index: Index, retriever: RetrieverName, queries: Iterable[str]) -> dict[str, str]:
    """Each distinct query's top chunk id through `retriever` ('' when nothing is found):
    one retrieval per question, however many plans are judged on it."""
    search = chunk_retriever(index, retriever)
    out: dict[str, str] = {}
    for query in queries:
        if query not in out:
            hits = search.search(query, 1)
            out[query] = hits[0].id if hits else ""
    return out


def coverage(plan: ResidencyPlan, tops: dict[str, str], entries: Sequence[LogEntry]) -> float:
    """Share of the entries (by count) whose top chunk (`tops`) is resident in `plan`."""
    resident = plan.resident_chunk_ids()
    total = sum(e.count for e in entries)
    covered = sum(e.count for e in entries if tops.get(e.query, "") in resident)
    return covered / total if total else 0.0


def window_coverage(
    plan: ResidencyPlan, index: Index, retriever: RetrieverName, entries: Sequence[LogEntry]
) -> float:
    """Share of the entries (by count) whose top chunk through `retriever` is resident."""
    return coverage(plan, top_chunks(index, retriever, (e.query for e in entries)), entries)


def encoder_of(plan: ResidencyPlan, upstream: str | None) -> ModelTokenizer:
    """The tokenizer the served plan was counted with: its directory, the upstream's own
    /tokenize (a plan made with --server), or the approximate rule."""
    label = plan.prefix.tokenizer
    if label.startswith("tokenizer:"):
        return LocalTokenizer(Path(label.removeprefix("tokenizer:")))
    if label.startswith("server:"):
        if upstream is None:
            raise ConfigError(f"re-plan: plan counted with {label} needs an --upstream to count")
        return ServerTokenizer(upstream)
    return ApproxTokenizer()


def replan(
    plan: ResidencyPlan,
    index: Index,
    retriever: RetrieverName,
    encoder: ModelTokenizer,
    window: LogRead,
    source: Path,
    canary: Sequence[str] = (),
) -> Judgement:
    """A plan from the window less its held-back part (every HOLD_BACK_EVERY-th question),
    counted with `encoder` (`encoder_of` the served plan), judged against the served one
    through `retriever` on the whole window, on the held-back part and on the `canary`
    questions (CPU-bound: run in a thread)."""
    held = window.entries[HOLD_BACK_EVERY - 1 :: HOLD_BACK_EVERY]
    made_from = LogRead(
        entries=tuple(
            e for i, e in enumerate(window.entries) if i % HOLD_BACK_EVERY != HOLD_BACK_EVERY - 1
        ),
        skipped=(),
    )
    stamps = [e.ts for e in made_from.entries if e.ts is not None]
    files = (
        LogFileSummary(
            path=str(source),
            entries=len(made_from.entries),
            total_count=made_from.total_count,
            skipped=0,
            first_ts=min(stamps) if stamps else None,
            last_ts=max(stamps) if stamps else None,
        ),
    )
    # The served plan's prefix count is kept: the host holds that many warmed prefixes, and
    # searching every count costs one knapsack packing per count (25 on the English sample at
    # an 8K window, ~1.3 s each): a new count is `residency plan`'s decision, not the loop's.
    plan_settings = PlanSettings(strategy=plan.strategy, prefixes=len(plan.all_prefixes()))
    pins = tuple(dict.fromkeys(i.section_id for i in plan.resident if i.pinned))
    candidate = plan_from_log(
        index,
        made_from,
        files,
        plan.capacity,
        encoder,
        plan_settings,
        pins,
    )
    entries = window.entries
    tops = top_chunks(index, retriever, [*(e.query for e in entries), *canary])
    asked = [LogEntry(query=q) for q in canary]
    return Judgement(
        questions=window.total_count,
        current=coverage(plan, tops, entries),
        candidate=coverage(candidate, tops, entries),
        plan=candidate,
        held_current=coverage(plan, tops, held),
        held_candidate=coverage(candidate, tops, held),
        canary_current=coverage(plan, tops, asked) if asked else None,
        canary_candidate=coverage(candidate, tops, asked) if asked else None,
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

    def _canary_questions(self) -> list[str]:
        """The canary's labelled questions, where --canary is set (unreadable: none)."""
        if self._agent.canary is None:
            return []
        try:
            return [q.query for q in read_canary(self._agent.canary)]
        except ConfigError as exc:
            log.info("re-plan: judged without the canary set (%s)", exc)
            return []

    async def step(self) -> str:
        """One re-plan: 'swap', 'keep', 'refused', 'failed' or 'waiting' (too few questions)."""
        state = self._reloader.current.state
        try:
            window = await anyio.to_thread.run_sync(
                read_window,
                self._log_path,
                self._agent.replan_window,
                self._agent.replan_source_share,
            )
        except ResidencyError as exc:
            log.info(
                "re-plan: query log unreadable (%s); next try in %g s",
                exc,
                self._agent.replan_every_s,
            )
            return "waiting"
        if window.total_count < MIN_WINDOW:
            return "waiting"
        plan, index = state.builder.plan, state.builder.index
        try:
            canary = await anyio.to_thread.run_sync(self._canary_questions)
            # a plan counted by the server: its /tokenize is asked for the model (I/O)
            encoder = await anyio.to_thread.run_sync(encoder_of, plan, self._settings.upstreams[0])
            judged = await anyio.to_thread.run_sync(
                replan,
                plan,
                index,
                self._settings.retriever,
                encoder,
                window,
                self._log_path,
                canary,
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
            f"({judged.gain:+.3f}, margin {self._agent.replan_margin:.3f}); held back "
            f"{judged.held_current:.3f} -> {judged.held_candidate:.3f}"
        )
        if judged.canary_current is not None:
            said += f"; canary {judged.canary_current:.3f} -> {judged.canary_candidate:.3f}"
        if not judged.swap(self._agent.replan_margin):
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
            log.warning(
                "re-plan: serving the new plan, but --plan %s was not rewritten (%s)",
                self._settings.plan,
                exc.strerror,
            )
        m.replans.labels("swap").inc()
        return "swap"


def check_replan(settings: ServeSettings) -> None:
    """--replan-every reads the router's own query log: refuse it without one."""
    if settings.agent.replan_every_s is not None and settings.log is None:
        raise ConfigError("--replan-every re-plans from the query log: drop --no-log")
