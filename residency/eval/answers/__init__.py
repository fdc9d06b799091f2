"""Answer-quality evaluation (`residency eval answers`): rag, whole-text and residency answers,
scored by the reference scorer and optionally an LLM judge, 0/1/2 per question type.

May import: planner, the cross-cutting modules, corpus, index, models, planning, retrieval,
serve, timex.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from residency.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from residency.eval.answers.judge import Judge, JudgeError, grade_schema, parse_grade
    from residency.eval.answers.options import STRATEGIES, AnswerEvalOptions, default_strategies
    from residency.eval.answers.records import (
        OTHER_TYPE,
        QUESTION_TYPES,
        AnswerEvalReport,
        AnswerQuestion,
        AnswerRecord,
        Grade,
        ScoreSummary,
        StrategyReport,
        load_answer_questions,
    )
    from residency.eval.answers.run import AnswerEvalJob, run_answer_eval
    from residency.eval.answers.scoring import (
        judge_verdict,
        score_group,
        summarize,
        summarize_by_type,
    )

__all__ = [
    "OTHER_TYPE",
    "QUESTION_TYPES",
    "STRATEGIES",
    "AnswerEvalJob",
    "AnswerEvalOptions",
    "AnswerEvalReport",
    "AnswerQuestion",
    "AnswerRecord",
    "Grade",
    "Judge",
    "JudgeError",
    "ScoreSummary",
    "StrategyReport",
    "default_strategies",
    "grade_schema",
    "judge_verdict",
    "load_answer_questions",
    "parse_grade",
    "run_answer_eval",
    "score_group",
    "summarize",
    "summarize_by_type",
]

__getattr__ = lazy_exports(__name__, __file__)
