"""Prompt assembly: the resident prefix as the first system message, token-identical to what
`residency warm` prefilled; the request's own context (time period, retrieved passages, the
client's system instructions) goes into the last user turn, after the cached part.

Shape of a chat request after assembly (the first two lines are byte-identical on every request,
so vLLM's block hashes match up to the user turn):

    system: plan.prefix.text                        <- resident, cached
    ... earlier turns of the client, unchanged ...
    user:   # 質問の対象期間 / Period ...             <- only when the question names a period
            # 検索で見つかった文書 / Retrieved passages
            [id: notes/...] title [日付: 2025-01-03]
            passage text
            # 質問 / Question
            <the client's last user message>

Retrieved text sits in the user turn rather than in a second system message because several chat
templates (Qwen3.5's among them) refuse a system message that is not first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from residency.errors import ConfigError
from residency.prompt_language import JA, PromptLanguage

# The Japanese corpus's headings (an English corpus gets `EN`'s: see prompt_language.py).
RETRIEVED_HEADER = JA.retrieved_heading
QUESTION_HEADER = JA.question_heading
CLIENT_SYSTEM_HEADER = JA.client_system_heading


@dataclass(frozen=True, slots=True)
class ContextBlock:
    """What one request adds after the resident prefix."""

    period_line: str | None
    passages: tuple[str, ...]  # rendered passages, in prompt order
    language: PromptLanguage = JA  # the headings' wording


def message_text(content: Any) -> str:
    """The text of a message's content: a string, or the text parts of a list of parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(p.get("text", ""))
            for p in content
            if isinstance(p, dict) and p.get("type") == "text"
        )
    return ""


def last_user_index(messages: Sequence[Any]) -> int:
    """Index of the last user message; `ConfigError` when there is none."""
    for i in range(len(messages) - 1, -1, -1):
        m = messages[i]
        if isinstance(m, dict) and m.get("role") == "user":
            return i
    raise ConfigError("'messages' holds no user message: nothing to answer")


def question_of(messages: Sequence[Any]) -> str:
    """The question retrieval runs on: the last user message's text."""
    text = message_text(messages[last_user_index(messages)].get("content")).strip()
    if not text:
        raise ConfigError("the last user message is empty: nothing to answer")
    return text


def _context_text(block: ContextBlock, client_system: Sequence[str]) -> str:
    parts: list[str] = []
    words = block.language
    if client_system:
        parts.append(words.client_system_heading + "\n" + "\n\n".join(client_system))
    if block.period_line:
        parts.append("# " + block.period_line)
    if block.passages:
        parts.append(words.retrieved_heading + "\n\n" + "\n\n".join(block.passages))
    return "\n\n".join(parts)


def assemble_messages(
    messages: Sequence[Any], prefix_text: str, block: ContextBlock
) -> list[dict[str, Any]]:
    """The upstream `messages`: resident prefix first, the context in the last user turn.

    The client's own system messages are moved into the last user turn (under
    CLIENT_SYSTEM_HEADER) so that the first message is always the resident prefix alone.
    """
    target = last_user_index(messages)
    client_system = [
        message_text(m.get("content")).strip()
        for m in messages
        if isinstance(m, dict) and m.get("role") in ("system", "developer")
    ]
    client_system = [s for s in client_system if s]
    question_heading = block.language.question_heading
    out: list[dict[str, Any]] = [{"role": "system", "content": prefix_text}]
    context = _context_text(block, client_system)
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") in ("system", "developer"):
            continue
        if i == target and context:
            m = dict(m)
            content = m.get("content")
            if isinstance(content, list):
                m["content"] = [{"type": "text", "text": context + "\n\n" + question_heading}]
                m["content"] += content
            else:
                m["content"] = f"{context}\n\n{question_heading}\n{message_text(content)}"
        out.append(m)
    return out
