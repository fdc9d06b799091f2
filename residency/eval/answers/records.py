"""The answer eval's file and HTTP shapes: questions in, the judge's grade, per-question records
out (jsonl), and the per-strategy / per-type summaries of the report (`--json`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from residency.eval.answers.options import StrategyName
from residency.eval.questions import read_records
from residency.machine import MachineInfo

# A strategy's label in reports: "echo", "rag-top3", "rag-top5", "whole", "residency".
_LABEL = r"^(echo|rag-top[1-9][0-9]*|whole|residency)$"
# The reference measurement's six types (docs/design/background.md); anything else is grouped
# under OTHER_TYPE.
QUESTION_TYPES: tuple[str, ...] = (
    "simple",
    "detail",
    "relation",
    "timeline",
    "inference",
    "unknown",
)
UNKNOWN_TYPE = "unknown"
OTHER_TYPE = "other"
Outcome = Literal[
    "correct", "partial", "hallucinated", "abstained", "judge_error", "generation_error"
]
Scorer = Literal["reference", "facts", "judge"]
Diagnosis = Literal["retrieval_miss", "generation_miss", "unanswerable", "error"]

_ID = 1024
_TEXT = 1_000_000


class AnswerQuestion(BaseModel):
    """One line of qa.jsonl: the question, its gold sections, its type and reference answer."""

    model_config = ConfigDict(frozen=True, extra="ignore", defer_build=True)

    id: str = Field(min_length=1, max_length=_ID, description="Question id (default: line N).")
    query: str = Field(min_length=1, max_length=100_000, pattern=r"\S", description="Question.")
    relevant_ids: tuple[str, ...] = Field(
        default=(),
        max_length=10_000,
        description="Gold section ids; empty: not answerable from the corpus.",
    )
    type: str = Field(
        default=OTHER_TYPE,
        min_length=1,
        max_length=128,
        description="Question type as written (simple, detail, relation, timeline, inference, "
        "unknown; others are scored under 'other').",
    )
    answer: str = Field(
        min_length=1, max_length=_TEXT, description="The reference answer the judge compares to."
    )


def load_answer_questions(path: Path) -> list[AnswerQuestion]:
    """Every question of a jsonl file (an id-less one is 'line N'); a bad line is a CorpusError
    naming file:line."""
    return read_records(path, AnswerQuestion, _default_id)


def _default_id(raw: dict[str, Any], line_no: int) -> dict[str, Any]:
    return raw if raw.get("id") else {**raw, "id": f"line {line_no}"}


class Grade(BaseModel):
    """The judge's verdict; its JSON schema is the judge's constrained output format."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    score: Literal[0, 1, 2] = Field(description="2 correct, 1 partly correct, 0 wrong.")
    abstained: bool = Field(
        description="The candidate said the text does not contain the answer (did not answer)."
    )


class AnswerRecord(BaseModel):
    """One question answered by one strategy and graded: a line of the records jsonl."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    strategy: str = Field(
        pattern=_LABEL, description="The strategy's label: echo, rag-topK, whole or residency."
    )
    kind: StrategyName = Field(description="echo, rag, whole or residency.")
    question_id: str = Field(min_length=1, max_length=_ID, description="Question id.")
    type: str = Field(
        min_length=1, max_length=128, description="Scoring group: one of the six types or 'other'."
    )
    query: str = Field(min_length=1, max_length=100_000, description="The question.")
    reference: str = Field(min_length=1, max_length=_TEXT, description="Reference answer.")
    relevant_ids: tuple[str, ...] = Field(max_length=10_000, description="Gold section ids.")
    answer: str | None = Field(
        max_length=_TEXT, description="The generated answer (None when generation failed)."
    )
    finish_reason: str | None = Field(
        max_length=64, description="stop, length, ... (None when generation failed)."
    )
    generation_error: str | None = Field(
        max_length=4000, description="Why no answer was generated, or None."
    )
    f1: float | None = Field(
        ge=0,
        le=1,
        description="Reference scorer: token F1 against the reference (None: no answer).",
    )
    recall: float | None = Field(
        ge=0, le=1, description="Reference scorer: share of the reference's tokens in the answer."
    )
    abstained: bool | None = Field(
        description="Reference scorer: the answer says the text does not hold the answer."
    )
    outcome: Outcome = Field(description="The reference scorer's verdict (reference.py).")
    score: int | None = Field(
        ge=0,
        le=2,
        description="The reference scorer's points (unknown + abstained = 2); None: no answer.",
    )
    fact_f1: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="Key-fact scorer: token F1 over the tokens not in the question "
        "(reference.py; None: no answer).",
    )
    fact_outcome: Outcome | None = Field(
        default=None, description="The key-fact scorer's verdict (None: no answer)."
    )
    fact_score: int | None = Field(
        default=None, ge=0, le=2, description="The key-fact scorer's points; None: no answer."
    )
    grade: Grade | None = Field(
        description="The judge's verdict; None without a judge or on error."
    )
    judge_error: str | None = Field(
        max_length=4000,
        description="Why the judge's answer could not be used (unparsable, truncated, HTTP), or "
        "None. Such records are excluded from the judge's means, never scored 0.",
    )
    judge_outcome: Outcome | None = Field(
        description="What the judge's grade counts as (scoring.judge_verdict); None: no judge."
    )
    judge_score: int | None = Field(
        ge=0, le=2, description="The judge's points; None without a judge, or when excluded."
    )
    route: str | None = Field(
        max_length=64, description="rag, whole, or the router's X-Residency-Route."
    )
    retrieved_ids: tuple[str, ...] = Field(
        max_length=10_000, description="Section ids of the passages added, best first."
    )
    citations: tuple[str, ...] = Field(
        default=(),
        max_length=10_000,
        description="Where each retrieved passage is from, best first: the source file and, for "
        "a PDF, the page ('manuals/pump.pdf p. 4'). RAG strategies only: the router's headers "
        "carry section ids.",
    )
    evidence_visible: bool | None = Field(
        description="A gold section was in the prompt (resident or retrieved); None: no gold."
    )
    prompt_tokens: int | None = Field(ge=0, description="usage.prompt_tokens.")
    cached_tokens: int | None = Field(
        ge=0, description="usage.prompt_tokens_details.cached_tokens (None: not reported)."
    )
    completion_tokens: int | None = Field(ge=0, description="usage.completion_tokens.")
    ttft_s: float | None = Field(ge=0, description="Seconds from request to first token.")
    decode_s: float | None = Field(ge=0, description="Seconds from first to last content token.")
    retrieval_s: float | None = Field(ge=0, description="Seconds spent retrieving (rag).")


class ScoreSummary(BaseModel):
    """Scores of a group of records (a strategy overall, or one question type)."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    questions: int = Field(ge=0, description="Records in the group.")
    graded: int = Field(ge=0, description="Records counted in the means (no error).")
    judge_errors: int = Field(ge=0, description="Judge answers that could not be used.")
    generation_errors: int = Field(ge=0, description="Questions without a generated answer.")
    mean_score: float | None = Field(
        ge=0, le=2, description="Mean points over graded records, out of 2; None if none graded."
    )
    correct: int = Field(ge=0, description="Score 2 (unknown: abstained counts here).")
    partial: int = Field(ge=0, description="Score 1.")
    hallucinated: int = Field(ge=0, description="Score 0 without abstaining: a wrong answer.")
    abstained: int = Field(
        ge=0, description="Score 0 and said the text does not state it (answerable questions)."
    )
    truthfulness: float | None = Field(
        ge=-1,
        le=1,
        description="CRAG-style (correct - hallucinated) / graded; None if none graded.",
    )
    mean_f1: float | None = Field(
        ge=0,
        le=1,
        description="Mean token F1 over answered questions that have an answer in the text "
        "(not 'unknown'); None for the judge's summary or when there are none.",
    )


class StrategyReport(BaseModel):
    """One strategy over the questions: scores, cost, evidence visibility, failures."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    strategy: str = Field(pattern=_LABEL, description="Label: echo, rag-topK, whole or residency.")
    kind: StrategyName = Field(description="echo, rag, whole or residency.")
    k: int | None = Field(ge=1, description="Passages retrieved per question (rag), else None.")
    skipped: str | None = Field(
        max_length=4000, description="Why the strategy did not run (None: it ran)."
    )
    overall: ScoreSummary = Field(description="The reference scorer over all its records.")
    by_type: dict[str, ScoreSummary] = Field(
        description="The reference scorer per question type (and 'other')."
    )
    facts_overall: ScoreSummary | None = Field(
        default=None, description="The key-fact scorer (tokens not in the question)."
    )
    facts_by_type: dict[str, ScoreSummary] | None = Field(
        default=None, description="The key-fact scorer per question type."
    )
    judge_overall: ScoreSummary | None = Field(description="The LLM judge's; None: no judge.")
    judge_by_type: dict[str, ScoreSummary] | None = Field(
        description="The LLM judge's per question type; None: no judge."
    )
    score_evidence_visible: float | None = Field(
        ge=0,
        le=2,
        description="Mean reference score of answerable questions whose gold was in the prompt.",
    )
    score_evidence_missing: float | None = Field(
        ge=0,
        le=2,
        description="Mean reference score of answerable questions whose gold was not.",
    )
    mean_prompt_tokens: float | None = Field(ge=0, description="Over answered questions.")
    mean_cached_tokens: float | None = Field(ge=0, description="Over answers reporting it.")
    mean_ttft_s: float | None = Field(ge=0, description="Over answered questions.")
    mean_decode_s: float | None = Field(ge=0, description="Over answered questions.")
    evidence_visible_share: float | None = Field(
        ge=0,
        le=1,
        description="Share of answered questions with gold ids whose evidence was in the "
        "prompt; None when it cannot be told (no gold ids, or residency without --plan).",
    )
    route_counts: dict[str, int] = Field(description="Answers per route.")
    failures: tuple[AnswerRecord, ...] = Field(
        description="Records not scored correct (by the reference scorer, or the judge when "
        "there is one), with their retrieved ids."
    )


class RunSettings(BaseModel):
    """What the run used, so a report can be reproduced."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    questions: str = Field(description="The questions file.")
    index_dir: str = Field(description="The index retrieved from.")
    generator: str | None = Field(description="Generator base URL (rag, whole).")
    generator_model: str | None = Field(description="Generator model name.")
    judge: str | None = Field(description="Judge base URL (None: reference scorer only).")
    judge_model: str | None = Field(description="Judge model name.")
    router: str | None = Field(description="Router base URL (residency).")
    plan: str | None = Field(description="plan.json read for resident section ids.")
    ks: tuple[int, ...] = Field(description="Passages retrieved per question, one rag per k.")
    max_tokens: int = Field(ge=1, description="max_tokens of every answer.")
    judge_max_tokens: int = Field(ge=1, description="max_tokens of every judge call.")


class AnswerEvalReport(BaseModel):
    """The whole run: settings, then one report per strategy on the same questions."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    settings: RunSettings = Field(description="Inputs of the run.")
    machine: MachineInfo | None = Field(
        default=None, description="The machine that ran the eval (TTFTs are the servers')."
    )
    evaluated: int = Field(ge=0, description="Questions asked of every strategy.")
    strategies: tuple[StrategyReport, ...] = Field(description="In the order asked.")
    notes: tuple[str, ...] = Field(description="Warnings worth a line (unknown gold ids, ...).")
