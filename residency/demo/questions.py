"""The demo's questions: picked from the sample QA set by where the plan put their evidence,
asked through the router (streamed), with the router's route and vLLM's cache numbers."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from residency.context.builder import ContextBuilder
from residency.context.headers import PREFIX_HEADER, read_route_headers
from residency.context.routing import RoutingSettings
from residency.context.settings import ContextSettings
from residency.errors import UpstreamError
from residency.eval.questions import load_questions
from residency.index import open_index
from residency.planning.plan_model import ResidencyPlan
from residency.query_log import read_query_log
from residency.timex import resolve_period
from residency.vllm_client import VllmClient

Intent = Literal["resident", "long_tail", "dated", "unknown"]
# The sample notes cover 2025. With --today 2025-06-15 "last month" is May 2025 and "this
# February" February 2025, whose notes a plan built from the sample log leaves to retrieval;
# the first candidate whose period holds a long-tail note is asked (the New Year's notes are
# asked about so often that they are resident, which routes a question about them "resident").
DATED_CANDIDATES: dict[str, tuple[str, ...]] = {
    "ja": (
        "先月、御影瀬で何をした？",
        "今年の2月に北防波堤で何があった？",
        "今年の正月に神崎灯台で何があった？",
    ),
    "en": (
        "What did we do at Mikagese last month?",
        "What happened at the North Breakwater this February?",
        "What happened at Kanzaki Lighthouse over the New Year holidays?",
    ),
}


class QuestionResult(BaseModel):
    """One question through the router: its route, what was retrieved, and vLLM's numbers."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    question: str = Field(min_length=1, max_length=4096, description="What was asked.")
    intent: Intent = Field(description="Why it was picked: where the plan put its evidence.")
    route: str = Field(min_length=1, max_length=64, description="X-Residency-Route.")
    answer: str = Field(max_length=100_000, description="The streamed answer text.")
    finish_reason: str | None = Field(max_length=64, description="stop, length, ...")
    retrieved: tuple[str, ...] = Field(
        max_length=1_000, description="X-Residency-Retrieved: section ids, in prompt order."
    )
    prompt_tokens: int = Field(ge=0, le=10_000_000, description="usage.prompt_tokens.")
    cached_tokens: int | None = Field(
        ge=0, le=10_000_000, description="usage.prompt_tokens_details.cached_tokens."
    )
    ttft_s: float = Field(ge=0, le=86_400, description="Seconds to the first streamed event.")
    prefix: str | None = Field(
        default=None, max_length=64, description="X-Residency-Prefix: the prefix it went with."
    )


def router_routes(plan: ResidencyPlan, index_dir: Path, today: dt.date) -> Callable[[str], str]:
    """The route the demo's router (BM25, --today) will give a question, computed here by the
    same ContextBuilder."""
    settings = ContextSettings(retriever="bm25", routing=RoutingSettings(today=today))
    builder = ContextBuilder(plan, open_index(index_dir), settings)
    return lambda question: builder.retrieve(question).route


def pick_questions(
    plan: ResidencyPlan,
    qa_path: Path,
    today: dt.date,
    route_of: Callable[[str], str],
    log_path: Path | None = None,
) -> list[tuple[str, Intent]]:
    """A resident, a long-tail, a dated and an unanswerable question, as the router will route
    them (`route_of`: the library's own routing decision). A resident question is the first
    question of the set whose gold is resident and that routes `resident`, else the first such
    line of the query log: a small plan may hold no question's whole gold."""
    long_tail = set(plan.long_tail_section_ids)
    resident = {item.section_id for item in plan.resident}
    picked: dict[Intent, str] = {}
    for q in load_questions(qa_path):
        gold = set(q.relevant_ids)
        if not gold:
            picked.setdefault("unknown", q.query)
        elif "resident" not in picked and gold & resident and route_of(q.query) == "resident":
            picked["resident"] = q.query
        elif "long_tail" not in picked and gold <= long_tail and route_of(q.query) == "long_tail":
            picked["long_tail"] = q.query
    if "resident" not in picked and log_path is not None:
        for entry in read_query_log(log_path).entries:
            if route_of(entry.query) == "resident":
                picked["resident"] = entry.query
                break
    picked["dated"] = dated_question(plan, today)
    order: tuple[Intent, ...] = ("resident", "long_tail", "dated", "unknown")
    return [(picked[intent], intent) for intent in order if intent in picked]


def dated_question(plan: ResidencyPlan, today: dt.date) -> str:
    """The first dated candidate (in the corpus's language) whose period holds a long-tail
    note (else the last one)."""
    index = open_index(Path(plan.index_dir))
    candidates = DATED_CANDIDATES[index.language.code]
    days = [
        day
        for sid in plan.long_tail_section_ids
        if index.has_section(sid) and (day := index.section(sid).date) is not None
    ]
    for question in candidates:
        period = resolve_period(question, today)
        if period is not None and any(period.contains(day) for day in days):
            return question
    return candidates[-1]


def ask(client: VllmClient, question: str, intent: Intent, answer_tokens: int) -> QuestionResult:
    """Stream one chat request through the router; TTFT is the wait for its first SSE event."""
    body = {
        "messages": [{"role": "user", "content": question}],
        "max_tokens": answer_tokens,
        "temperature": 0,
    }
    try:
        answer = client.stream_chat(body)
    except UpstreamError as exc:
        raise UpstreamError(f"{exc} (asking {question!r})") from None
    route, retrieved = read_route_headers(answer.headers)
    return QuestionResult(
        question=question,
        intent=intent,
        route=route or "?",
        answer=answer.text.strip(),
        finish_reason=answer.finish_reason,
        retrieved=retrieved,
        prompt_tokens=answer.prompt_tokens or 0,
        cached_tokens=answer.cached_tokens,
        ttft_s=answer.first_event_s or 0.0,
        prefix=answer.headers.get(PREFIX_HEADER.lower()),
    )


def ask_all(
    router_url: str, questions: list[tuple[str, Intent]], answer_tokens: int
) -> list[QuestionResult]:
    """Ask each question in turn."""
    with VllmClient(router_url, timeout_s=600.0, flag="router") as client:
        return [ask(client, q, intent, answer_tokens) for q, intent in questions]
