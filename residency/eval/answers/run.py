"""`residency eval answers` end to end: resolve endpoints, build each strategy, answer every
question, score it (reference scorer always, LLM judge when given), append records line by
line, and report the strategies side by side."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import orjson

from residency.atomic import append_line, write_bytes_atomic
from residency.errors import ConfigError
from residency.eval.answers.generate import (
    AnswerStrategy,
    EchoStrategy,
    Endpoint,
    RagStrategy,
    ResidencyStrategy,
    WholeStrategy,
    whole_skip_reason,
    whole_text,
)
from residency.eval.answers.judge import Judge, JudgeError
from residency.eval.answers.options import AnswerEvalOptions, StrategyName
from residency.eval.answers.records import (
    AnswerEvalReport,
    AnswerQuestion,
    AnswerRecord,
    Grade,
    RunSettings,
    StrategyReport,
)
from residency.eval.answers.report import build_record, strategy_report
from residency.index import BuildProgress, Index
from residency.machine import machine_info
from residency.planning.plan_model import read_plan
from residency.vllm_client import VllmClient

DEFAULT_TIMEOUT_S = 600.0  # a cold whole-text prefill on a CPU takes seconds, not minutes


@dataclass(frozen=True)
class AnswerEvalJob:
    """Everything `residency eval answers` was asked: the questions, the index and the options."""

    questions_path: Path
    questions: Sequence[AnswerQuestion]
    index: Index
    options: AnswerEvalOptions
    timeout_s: float = DEFAULT_TIMEOUT_S

    @property
    def strategies(self) -> tuple[StrategyName, ...]:
        """The strategies to run, each once."""
        return self.options.strategies

    @property
    def ks(self) -> tuple[int, ...]:
        """One rag per k."""
        return self.options.ks


def check_job(job: AnswerEvalJob) -> None:
    """Refuse contradictory or incomplete settings before any request is sent (each value's
    bounds are `AnswerEvalOptions`')."""
    o = job.options
    needs_generator = [s for s in job.strategies if s in ("rag", "whole")]
    if needs_generator and not o.generator:
        raise ConfigError(f"--strategy {needs_generator[0]} needs --generator URL")
    if "residency" in job.strategies and not o.router:
        raise ConfigError("--strategy residency needs --router URL (residency serve)")
    if o.judge_model and not o.judge:
        raise ConfigError(f"--judge-model {o.judge_model}: pass the judge's URL with --judge")


def resolve_model(client: VllmClient, given: str | None, flag: str) -> str:
    """The model to ask for: `given`, else the endpoint's only `/v1/models` entry."""
    if given:
        return given
    models = client.models()
    if len(models) > 1:
        raise ConfigError(
            f"{client.base_url} serves {len(models)} models "
            f"({', '.join(m.id for m in models[:5])}); pick one with {flag}"
        )
    return models[0].id


def _resident_ids(plan: Path | None) -> frozenset[str] | None:
    if plan is None:
        return None
    return frozenset(item.section_id for item in read_plan(plan).resident)


@dataclass(frozen=True)
class Skipped:
    """A strategy that cannot run here, and why."""

    name: str
    kind: StrategyName
    reason: str


def build_strategies(
    job: AnswerEvalJob, generator: Endpoint | None, router: VllmClient | None
) -> list[AnswerStrategy | Skipped]:
    """The strategies in the order asked, each ready to run or skipped with the reason (whole
    over max_model_len)."""
    built: list[AnswerStrategy | Skipped] = []
    for name in dict.fromkeys(job.strategies):
        if name == "echo":
            built.append(EchoStrategy())
        elif name == "rag":
            assert generator is not None
            for k in job.ks:
                built.append(RagStrategy(job.index, generator, k, job.options.max_tokens))
        elif name == "whole":
            assert generator is not None
            system = whole_text(job.index.sections, job.index.language)
            reason = whole_skip_reason(
                generator.client, generator.model, system, job.options.max_tokens
            )
            if reason is not None:
                built.append(Skipped(name, name, reason))
                continue
            ids = [s.id for s in job.index.sections]
            built.append(WholeStrategy(system, ids, generator, job.options.max_tokens))
        else:
            assert router is not None
            model = resolve_model(router, job.options.generator_model, "--generator-model")
            endpoint = Endpoint(router, model)
            built.append(
                ResidencyStrategy(endpoint, _resident_ids(job.options.plan), job.options.max_tokens)
            )
    return built


def _notes(job: AnswerEvalJob) -> list[str]:
    notes: list[str] = []
    missing = sorted(
        {g for q in job.questions for g in q.relevant_ids if not job.index.has_section(g)}
    )
    if missing:
        notes.append(
            f"{len(missing)} gold id(s) are not sections of the index (e.g. {missing[0]}): "
            "their evidence never counts as visible"
        )
    if "residency" in job.strategies and job.options.plan is None:
        notes.append("residency without --plan: the share of visible gold evidence is not known")
    return notes


def grade_answer(
    judge: Judge, question: AnswerQuestion, answer: str
) -> tuple[Grade | None, str | None]:
    """(grade, None) or (None, why the judge's answer could not be used)."""
    try:
        return judge.grade(question.query, question.answer, answer), None
    except JudgeError as exc:
        return None, str(exc)


def run_strategy(
    strategy: AnswerStrategy,
    job: AnswerEvalJob,
    judge: Judge | None,
    progress: BuildProgress | None,
) -> list[AnswerRecord]:
    """Answer (and judge) every question with one strategy; a failure stays with its question."""
    records: list[AnswerRecord] = []
    if progress is not None:
        step = "answer + judge" if judge is not None else "answer"
        progress.start(f"{strategy.name}: {step}", len(job.questions))
    for question in job.questions:
        attempt = strategy.answer(question)
        grade, judge_error = None, None
        if attempt.answer is not None and judge is not None:
            grade, judge_error = grade_answer(judge, question, attempt.answer.text)
        record = build_record(
            strategy.name,
            strategy.kind,
            question,
            attempt,
            grade,
            judge_error,
            judged=judge is not None,
        )
        if job.options.records is not None:
            append_line(job.options.records, orjson.dumps(record.model_dump(mode="json")))
        records.append(record)
        if progress is not None:
            progress.advance(1)
    return records


def resolve_judge(
    job: AnswerEvalJob, generator: Endpoint | None, client: VllmClient | None
) -> Judge | None:
    """The LLM judge when --judge is given (its model: --judge-model, the generator's when the
    URL is the generator's, else the server's only model); None: reference scorer only."""
    if client is None:
        return None
    if job.options.judge_model:
        model = job.options.judge_model
    elif generator is not None and client.base_url == generator.base_url:
        model = generator.model
    else:
        model = resolve_model(client, None, "--judge-model")
    return Judge(client, model, job.options.judge_max_tokens)


def run_answer_eval(job: AnswerEvalJob, progress: BuildProgress | None = None) -> AnswerEvalReport:
    """Every strategy on the same questions, scored (and judged); records appended as they come."""
    check_job(job)
    with ExitStack() as clients:

        def client_for(url: str | None, flag: str) -> VllmClient | None:
            if not url:
                return None
            client = VllmClient(
                url, timeout_s=job.timeout_s, api_key=job.options.api_key, flag=flag
            )
            return clients.enter_context(client)

        generator = None
        generator_client = client_for(job.options.generator, "--generator")
        if generator_client is not None:
            model = resolve_model(
                generator_client, job.options.generator_model, "--generator-model"
            )
            generator = Endpoint(generator_client, model)
        judge = resolve_judge(job, generator, client_for(job.options.judge, "--judge"))
        built = build_strategies(job, generator, client_for(job.options.router, "--router"))
        return _run_all(job, built, generator, judge, progress)


def _run_all(
    job: AnswerEvalJob,
    built: list[AnswerStrategy | Skipped],
    generator: Endpoint | None,
    judge: Judge | None,
    progress: BuildProgress | None,
) -> AnswerEvalReport:
    """Run the built strategies in turn and assemble the report."""
    if job.options.records is not None:
        write_bytes_atomic(job.options.records, b"")  # this run's records only
    reports: list[StrategyReport] = []
    for entry in built:
        if isinstance(entry, Skipped):
            reports.append(strategy_report(entry.name, entry.kind, [], skipped=entry.reason))
            continue
        records = run_strategy(entry, job, judge, progress)
        known = entry.kind != "residency" or job.options.plan is not None
        reports.append(
            strategy_report(
                entry.name,
                entry.kind,
                records,
                k=entry.k,
                judged=judge is not None,
                evidence_known=known,
            )
        )
    settings = RunSettings(
        questions=str(job.questions_path),
        index_dir=str(job.index.directory),
        generator=generator.base_url if generator else None,
        generator_model=generator.model if generator else None,
        judge=judge.base_url if judge else None,
        judge_model=judge.model if judge else None,
        router=job.options.router,
        plan=str(job.options.plan) if job.options.plan else None,
        ks=job.ks,
        max_tokens=job.options.max_tokens,
        judge_max_tokens=job.options.judge_max_tokens,
    )
    return AnswerEvalReport(
        settings=settings,
        machine=machine_info(),
        evaluated=len(job.questions),
        strategies=tuple(reports),
        notes=tuple(_notes(job)),
    )
