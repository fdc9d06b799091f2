"""The fixed words of every prompt residency builds, per corpus language: the answer policy, the
headings around documents, passages and the question, and the date and period labels.

Japanese corpora keep the bilingual wording the project started with (byte-identical, so plans
and caches made before stay valid); English corpora get English only, because a small
English-first model (SmolLM2-135M) reads Japanese scaffolding as noise. The language of a corpus
is read off its text (`detect_language`): Japanese when at least a fifth of its letters are kana
or kanji.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

LanguageCode = Literal["ja", "en"]

# Kana, kanji and their marks (the ranges tokenize_ja treats as CJK).
_CJK = re.compile(
    "[\u3005-\u3007\u3041-\u309f\u30a1-\u30fa\u30fc-\u30ff\u3400-\u4dbf\u4e00-\u9fff]"
)
_LETTER = re.compile(r"[^\W\d_]")
JAPANESE_SHARE = 0.2
_SAMPLE_CHARS = 200_000


@dataclass(frozen=True, slots=True)
class PromptLanguage:
    """Every fixed string of a prompt in one language."""

    code: LanguageCode
    instructions: str  # the answer policy, first in the resident prefix
    docs_heading: str  # above the resident sections
    date_label: str  # "[<label>: YYYY-MM-DD]" after a dated section's title
    retrieved_heading: str  # above the retrieved passages, in the user turn
    question_heading: str  # above the client's question when context precedes it
    client_system_heading: str  # above the client's own system messages, moved to the user turn
    period_label: str  # "<label>: 2025-01-01 <sep> 2025-01-07 (<expression>)"
    range_separator: str
    expression_format: str  # how the matched expression follows the dates


JA = PromptLanguage(
    code="ja",
    instructions=(
        "あなたは以下の参照文書だけに基づいて答えるアシスタントです。"
        "文書に答えが書かれていない場合は、推測せずに「文書には記載がありません」と明言してください。"
        "答えの根拠にした文書の id を示してください。\n"
        "Answer only from the reference documents below. If they do not contain the answer, "
        "say plainly that the documents do not state it; do not guess. Cite the ids you used."
    ),
    docs_heading="# 参照文書 / Reference documents",
    date_label="日付",
    retrieved_heading="# 検索で見つかった文書 / Retrieved passages",
    question_heading="# 質問 / Question",
    client_system_heading="# 追加の指示 / Additional instructions",
    period_label="質問の対象期間 / Period asked about",
    range_separator=" 〜 ",
    expression_format="（{}）",
)

EN = PromptLanguage(
    code="en",
    instructions=(
        "You answer questions using only the reference documents below. "
        'If the documents do not contain the answer, say "The documents do not say." '
        "and do not guess. Answer in one or two short sentences."
    ),
    docs_heading="# Reference documents",
    date_label="date",
    retrieved_heading="# Retrieved passages",
    question_heading="# Question",
    client_system_heading="# Additional instructions",
    period_label="Period asked about",
    range_separator=" to ",
    expression_format=" ({})",
)

LANGUAGES: dict[LanguageCode, PromptLanguage] = {"ja": JA, "en": EN}


def japanese_share(text: str) -> float:
    """Share of the letters in text that are kana or kanji (0.0 for text without letters)."""
    letters = len(_LETTER.findall(text))
    return len(_CJK.findall(text)) / letters if letters else 0.0


def detect_language(texts: Iterable[str]) -> PromptLanguage:
    """JA when at least JAPANESE_SHARE of the letters (over the first 200K chars) are CJK."""
    sample: list[str] = []
    size = 0
    for text in texts:
        sample.append(text)
        size += len(text)
        if size >= _SAMPLE_CHARS:
            break
    return JA if japanese_share("".join(sample)) >= JAPANESE_SHARE else EN
