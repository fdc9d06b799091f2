"""The reference scorer: grades an answer against the reference answer with no model at all.

Two measurements, both deterministic:

* **token F1** (SQuAD's): both texts are normalised (NFKC, lower case, punctuation and symbols
  removed, the English articles a / an / the dropped), split into tokens — a word for Latin
  script and digits, one token per character for kana and kanji (JSQuAD scores Japanese by
  character) — and F1 is the harmonic mean of precision and recall of the tokens they share
  (multiset overlap). Recall alone (the share of reference tokens the answer holds) is kept too:
  a verbose answer with the right facts has high recall and low precision.
* **abstained**: the answer says the text does not hold the answer. It is a match of one of
  `ABSTENTION_PATTERNS` (English: "does not say / state / mention ...", "not stated /
  mentioned / specified ...", "no information", "cannot find / answer / determine", "I don't
  know", "not in the text / documents"; Japanese: 記載がありません, 書かれていません, わかりません,
  不明です, ...) anywhere in the lower-cased, NFKC-normalised answer.

Verdict on the judge's 0/1/2 scale, so both scorers fill the same table:

* ``unknown`` questions: abstained → correct (2); any other answer → hallucinated (0).
* answerable questions: F1 >= `CORRECT_F1` (0.5) → correct (2); F1 >= `PARTIAL_F1` (0.2) →
  partial (1); below that an abstention → abstained (0), anything else → hallucinated (0).

**Key facts** (a second score beside it): restating the question earns token F1 (the question
as its own answer, `echo`, scored 0.42 of 2 on a held-out English set, above every real
strategy). So the key-fact score compares only what is new: the reference's tokens that are not
in the question (its numbers, names, dates) against the answer's tokens that are not in the
question, as token F1 with the same thresholds. `echo` scores 0 on it by construction. A
reference with no token outside the question (a yes/no answer restated) falls back to plain F1.

Worked example: reference "Only Kanzaki Lighthouse (fog signal FS-20)." → tokens [only, kanzaki,
lighthouse, fog, signal, fs, 20]; answer "The Kanzaki Lighthouse has the FS-20 fog signal." →
[kanzaki, lighthouse, has, fs, 20, fog, signal]; 6 shared, precision 6/7, recall 6/7, F1 0.857:
correct.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from dataclasses import dataclass

from residency.eval.answers.records import UNKNOWN_TYPE, Outcome

CORRECT_F1 = 0.5
PARTIAL_F1 = 0.2
_ARTICLES = frozenset({"a", "an", "the"})
_CJK = "\u3005-\u3007\u3041-\u309f\u30a1-\u30fa\u30fc-\u30ff\u3400-\u4dbf\u4e00-\u9fff"
_TOKENS = re.compile(f"([{_CJK}])|([^\\W_{_CJK}]+)")
_VERBS = "say|says|state|states|mention|mentions|specify|specifies|contain|contains|include"
_VERBS += "|includes|provide|provides|cover|covers|tell|give|list|show|indicate|describe"
_PARTICIPLES = "stated|mentioned|specified|provided|given|included|listed|recorded|covered"
_PARTICIPLES += "|described|documented|available|known|indicated|addressed"
ABSTENTION_PATTERNS: tuple[str, ...] = (
    rf"\b(does|do|did)(n't| not) ({_VERBS})\b",
    rf"\b(is|are|was|were)(n't| not) ({_PARTICIPLES})\b",
    rf"\bnot ({_PARTICIPLES}) (in|by) the (text|documents?|passages?|context|sources?)\b",
    r"\bno (information|mention|record|records|details?|data)\b",
    r"\b(cannot|can't|can not|unable to|could not|couldn't) (find|answer|determine|tell|say)\b",
    r"\bi (don't|do not) know\b",
    r"\bnot (in|part of|found in) the (text|documents?|passages?|context)\b",
    r"記載(が|は)?(あり|ござい)ません",
    r"記載(されて|して)い?ません",
    r"記載なし",
    r"(書かれて|触れられて|言及されて|述べられて)い?ません",
    r"(わかり|分かり|見当たり)ません",
    r"不明です",
)
_ABSTENTION = re.compile("|".join(f"(?:{p})" for p in ABSTENTION_PATTERNS))


def normalize_answer(text: str) -> str:
    """NFKC, lower case, punctuation and symbols replaced by spaces, spaces collapsed."""
    folded = unicodedata.normalize("NFKC", text).lower()
    kept = "".join(" " if unicodedata.category(ch)[0] in "PS" else ch for ch in folded)
    return " ".join(kept.split())


def answer_tokens(text: str) -> list[str]:
    """Words (Latin, digits) and single kana/kanji of the normalised text, articles dropped."""
    tokens: list[str] = []
    for cjk, word in _TOKENS.findall(normalize_answer(text)):
        token = cjk or word
        if token not in _ARTICLES:
            tokens.append(token)
    return tokens


def overlap(answer: list[str], reference: list[str]) -> int:
    """Tokens the two share, counted as a multiset."""
    return sum((Counter(answer) & Counter(reference)).values())


def token_f1(answer: str, reference: str) -> float:
    """SQuAD token F1 of answer against reference (0.0 when either has no tokens)."""
    return _f1(answer_tokens(answer), answer_tokens(reference))


def token_recall(answer: str, reference: str) -> float:
    """Share of the reference's tokens that the answer holds (0.0 for an empty reference)."""
    want = answer_tokens(reference)
    return overlap(answer_tokens(answer), want) / len(want) if want else 0.0


def is_abstention(answer: str) -> bool:
    """True when the answer says the text does not hold the answer (ABSTENTION_PATTERNS)."""
    return _ABSTENTION.search(unicodedata.normalize("NFKC", answer).lower()) is not None


def _f1(got: list[str], want: list[str]) -> float:
    common = overlap(got, want)
    if not got or not want or common == 0:
        return 0.0
    precision, recall = common / len(got), common / len(want)
    return 2 * precision * recall / (precision + recall)


def _without(tokens: list[str], question: Counter[str]) -> list[str]:
    return [t for t in tokens if t not in question]


def key_fact_f1(answer: str, reference: str, question: str) -> float:
    """Token F1 over the tokens that are not in the question (plain F1 when the reference has
    none): 'Lamp 3 was replaced in 1987' for 'When was lamp 3 replaced?' is judged on '1987'.
    """
    asked = Counter(answer_tokens(question))
    want = _without(answer_tokens(reference), asked)
    if not want:
        return token_f1(answer, reference)
    return _f1(_without(answer_tokens(answer), asked), want)


@dataclass(frozen=True, slots=True)
class ReferenceVerdict:
    """The reference scorer's view of one answer (plain token F1, and key facts only)."""

    f1: float
    recall: float
    abstained: bool
    outcome: Outcome
    score: int
    fact_f1: float = 0.0
    fact_outcome: Outcome = "hallucinated"
    fact_score: int = 0


def _verdict(group: str, f1: float, abstained: bool) -> tuple[Outcome, int]:
    if group == UNKNOWN_TYPE:
        outcome: Outcome = "correct" if abstained else "hallucinated"
    elif f1 >= CORRECT_F1:
        outcome = "correct"
    elif f1 >= PARTIAL_F1:
        outcome = "partial"
    else:
        outcome = "abstained" if abstained else "hallucinated"
    return outcome, {"correct": 2, "partial": 1}.get(outcome, 0)


def score_reference(
    group: str, answer: str, reference: str, question: str = ""
) -> ReferenceVerdict:
    """F1, recall, abstention and the 0/1/2 verdicts of an answer in scoring group `group`:
    by plain token F1, and by key facts (tokens not in `question`)."""
    f1, recall = token_f1(answer, reference), token_recall(answer, reference)
    abstained = is_abstention(answer)
    outcome, points = _verdict(group, f1, abstained)
    fact_f1 = key_fact_f1(answer, reference, question)
    fact_outcome, fact_points = _verdict(group, fact_f1, abstained)
    return ReferenceVerdict(
        f1, recall, abstained, outcome, points, fact_f1, fact_outcome, fact_points
    )
