"""The demo's questions: picked from the sample QA set by where the plan put their evidence,
asked through the router (streamed), with the router's route and vLLM's cache numbers."""

from __future__ import annotations

import datetime as dt
import time
import urllib.parse
from pathlib import Path
from typing import Any, Literal

import httpx
import orjson
from pydantic import BaseModel, ConfigDict, Field

from residency.errors import UpstreamError
from residency.eval_retrieval import load_questions
from residency.index import open_index
from residency.planning.plan_model import ResidencyPlan
from residency.timex import resolve_period

Intent = Literal["resident", "long_tail", "dated", "unknown"]
# The sample notes cover 2025. With --today 2025-06-15 "last month" is May 2025 and "this
# February" February 2025, whose notes a plan built from the sample log leaves to retrieval;
# the first candidate whose period holds a long-tail note is asked (the New Year's notes are
# asked about so often that they are resident, which routes a question about them "resident").
DATED_CANDIDATES: tuple[str, ...] = (
    "先月、御影瀬で何をした？",
    "今年の2月に北防波堤で何があった？",
    "今年の正月に神崎灯台で何があった？",
)
ANSWER_TOKENS = 8  # random weights: the answer is noise; the prefill is what is measured


class QuestionResult(BaseModel):
    """One question through the router: its route, what was retrieved, and vLLM's numbers."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    question: str = Field(min_length=1, max_length=4096, description="What was asked.")
    intent: Intent = Field(description="Why it was picked: where the plan put its evidence.")
    route: str = Field(min_length=1, max_length=64, description="X-Residency-Route.")
    retrieved: tuple[str, ...] = Field(
        max_length=1_000, description="X-Residency-Retrieved: section ids, in prompt order."
    )
    prompt_tokens: int = Field(ge=0, le=10_000_000, description="usage.prompt_tokens.")
    cached_tokens: int | None = Field(
        ge=0, le=10_000_000, description="usage.prompt_tokens_details.cached_tokens."
    )
    ttft_s: float = Field(ge=0, le=86_400, description="Seconds to the first streamed event.")


def pick_questions(plan: ResidencyPlan, qa_path: Path, today: dt.date) -> list[tuple[str, Intent]]:
    """A resident, a long-tail, a dated and an unanswerable question, as the plan places them."""
    whole = {item.section_id for item in plan.resident if item.id == item.section_id}
    long_tail = set(plan.long_tail_section_ids)
    picked: dict[Intent, str] = {}
    for q in load_questions(qa_path):
        gold = set(q.relevant_ids)
        if gold and gold <= whole:
            picked.setdefault("resident", q.query)
        elif gold and gold <= long_tail:
            picked.setdefault("long_tail", q.query)
        elif not gold:
            picked.setdefault("unknown", q.query)
    picked["dated"] = dated_question(plan, today)
    order: tuple[Intent, ...] = ("resident", "long_tail", "dated", "unknown")
    return [(picked[intent], intent) for intent in order if intent in picked]


def dated_question(plan: ResidencyPlan, today: dt.date) -> str:
    """The first dated candidate whose period holds a long-tail note (else the last one)."""
    index = open_index(Path(plan.index_dir))
    days = [
        day
        for sid in plan.long_tail_section_ids
        if index.has_section(sid) and (day := index.section(sid).date) is not None
    ]
    for question in DATED_CANDIDATES:
        period = resolve_period(question, today)
        if period is not None and any(period.contains(day) for day in days):
            return question
    return DATED_CANDIDATES[-1]


def ask(client: httpx.Client, router_url: str, question: str, intent: Intent) -> QuestionResult:
    """Stream one chat request through the router; TTFT is the wait for its first SSE event."""
    body = {
        "messages": [{"role": "user", "content": question}],
        "max_tokens": ANSWER_TOKENS,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    usage: dict[str, Any] = {}
    ttft_s: float | None = None
    started = time.perf_counter()
    with client.stream(
        "POST", f"{router_url}/v1/chat/completions", content=orjson.dumps(body)
    ) as response:
        if response.status_code != 200:
            response.read()
            raise UpstreamError(
                f"router {router_url}: HTTP {response.status_code} for {question!r}: "
                f"{response.text[:300]}"
            )
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            if ttft_s is None:
                ttft_s = time.perf_counter() - started
            if line == "data: [DONE]":
                continue
            event = orjson.loads(line[6:])
            if isinstance(event, dict) and isinstance(event.get("usage"), dict):
                usage = event["usage"]
        route = response.headers.get("x-residency-route", "?")
        raw = response.headers.get("x-residency-retrieved", "")
    details = usage.get("prompt_tokens_details") or {}
    cached = details.get("cached_tokens")
    return QuestionResult(
        question=question,
        intent=intent,
        route=route,
        retrieved=tuple(urllib.parse.unquote(s) for s in raw.split(",") if s),
        prompt_tokens=int(usage.get("prompt_tokens") or 0),
        cached_tokens=cached if isinstance(cached, int) else None,
        ttft_s=ttft_s if ttft_s is not None else time.perf_counter() - started,
    )


def ask_all(router_url: str, questions: list[tuple[str, Intent]]) -> list[QuestionResult]:
    """Ask each question in turn."""
    with httpx.Client(timeout=httpx.Timeout(600.0, connect=5.0)) as client:
        return [ask(client, router_url, question, intent) for question, intent in questions]
