"""The LLM judge: grade a candidate answer against the reference with JSON-schema-constrained
output, through any OpenAI-compatible endpoint.

The judge sees the question, the reference answer and the candidate answer only (no passages, no
question type). Its output is constrained with `response_format: json_schema` (strict), the
schema of `Grade`. A vLLM judge honours the schema with its structured-output backend; by default
xgrammar lets whitespace run between JSON tokens, and a weak (or random-weight) model can spend
every token on it, so serve a vLLM judge with
`--structured-outputs-config '{"backend": "xgrammar", "disable_any_whitespace": true}'`
(compact JSON, ~25 tokens). Whatever still fails to parse is a `JudgeError`, never a 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
from pydantic import ValidationError

from residency.errors import ResidencyError, UpstreamError
from residency.eval.answers.defaults import DEFAULT_JUDGE_MAX_TOKENS
from residency.eval.answers.records import Grade
from residency.vllm_client import VllmClient

JUDGE_INSTRUCTIONS = (
    "あなたは採点者です。質問・参照解答・候補解答を読み、候補解答を参照解答と照らして採点します。\n"
    "You are a strict grader. Compare the candidate answer with the reference answer for the "
    "question and reply with one JSON object only:\n"
    '- "score": 2 if the candidate is correct and complete (it agrees with the reference), '
    "1 if it is partly correct (some facts right, some missing or wrong), 0 if it is wrong or "
    "gives no answer.\n"
    '- "abstained": true if the candidate says the information is not in the documents / it '
    "cannot answer, instead of giving an answer; false otherwise.\n"
    "If the reference says the documents do not state the answer, a candidate that also says so "
    "is correct (score 2, abstained true), and a candidate that invents an answer scores 0."
)


class JudgeError(ResidencyError):
    """The judge's answer could not be turned into a grade."""


def grade_schema() -> dict[str, Any]:
    """The JSON schema the judge's output is constrained to (closed object, both keys)."""
    return {
        "type": "object",
        "properties": {
            "score": {"type": "integer", "enum": [0, 1, 2]},
            "abstained": {"type": "boolean"},
        },
        "required": ["score", "abstained"],
        "additionalProperties": False,
    }


def judge_messages(question: str, reference: str, candidate: str) -> list[dict[str, str]]:
    """The judge's chat: instructions, then the question, reference and candidate only."""
    user = (
        f"質問 / Question:\n{question.strip()}\n\n"
        f"参照解答 / Reference answer:\n{reference.strip()}\n\n"
        f"候補解答 / Candidate answer:\n{candidate.strip() or '(empty)'}"
    )
    return [
        {"role": "system", "content": JUDGE_INSTRUCTIONS},
        {"role": "user", "content": user},
    ]


def parse_grade(text: str | None, finish_reason: str | None) -> Grade:
    """The grade in the judge's output; `JudgeError` saying why when there is none."""
    if text is None or not text.strip():
        raise JudgeError(f"empty judge output (finish_reason {finish_reason})")
    try:
        raw = orjson.loads(text)
    except orjson.JSONDecodeError:
        why = "truncated at max_tokens" if finish_reason == "length" else "not JSON"
        raise JudgeError(f"judge output {why}: {text[:80]!r}") from None
    try:
        return Grade.model_validate(raw, strict=True)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"]) or "output"
        raise JudgeError(f"judge output breaks the schema: {loc}: {err['msg']}") from None


@dataclass(frozen=True, slots=True)
class Judge:
    """A judge endpoint's client and model, with the token cap of one verdict."""

    client: VllmClient
    model: str
    max_tokens: int = DEFAULT_JUDGE_MAX_TOKENS

    @property
    def base_url(self) -> str:
        """The judge server's base URL."""
        return self.client.base_url

    def payload(self, question: str, reference: str, candidate: str) -> dict[str, Any]:
        """The chat request body: temperature 0, strict JSON-schema response format."""
        return {
            "model": self.model,
            "messages": judge_messages(question, reference, candidate),
            "temperature": 0,
            "max_tokens": self.max_tokens,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "grade", "schema": grade_schema(), "strict": True},
            },
        }

    def grade(self, question: str, reference: str, candidate: str) -> Grade:
        """Ask for a verdict; `JudgeError` for any reason it cannot be used."""
        try:
            done = self.client.complete_chat(self.payload(question, reference, candidate))
        except UpstreamError as exc:
            raise JudgeError(f"judge request failed: {exc}") from None
        return parse_grade(done.text, done.finish_reason)
