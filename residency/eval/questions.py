"""Question sets: one jsonl record per line, read strictly (a bad line is a `CorpusError` naming
file:line), into whichever record model a run needs — `Question` for retrieval, coverage and the
pruner, `answers.records.AnswerQuestion` for the answer eval."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from residency.errors import ConfigError, CorpusError

UNTYPED = "untyped"
Record = TypeVar("Record", bound=BaseModel)


class Question(BaseModel):
    """One line of a questions file (other fields, e.g. answer, are ignored)."""

    model_config = ConfigDict(frozen=True, extra="ignore", defer_build=True)

    query: str = Field(min_length=1, max_length=100_000, pattern=r"\S", description="Question.")
    relevant_ids: tuple[str, ...] = Field(
        max_length=10_000, description="Gold section ids; empty: not answerable from the corpus."
    )
    type: str | None = Field(default=None, max_length=128, description="Question type.")
    id: str | None = Field(default=None, max_length=1024, description="Question id.")


def read_records(
    path: Path,
    model: type[Record],
    fill: Callable[[dict[str, Any], int], dict[str, Any]] | None = None,
) -> list[Record]:
    """Every record of a jsonl file as `model` (`fill` completes a raw object, given its line
    number); blank lines are skipped, an empty file is a `CorpusError`."""
    try:
        raw_lines = path.read_bytes().splitlines()
    except OSError as exc:
        raise ConfigError(f"--questions {path}: cannot read ({exc.strerror})") from None
    records: list[Record] = []
    for line_no, line in enumerate(raw_lines, start=1):
        if not line.strip():
            continue
        try:
            raw = orjson.loads(line)
            if fill is not None and isinstance(raw, dict):
                raw = fill(raw, line_no)
            records.append(model.model_validate(raw))
        except orjson.JSONDecodeError as exc:
            raise CorpusError(f"{path}:{line_no}: invalid JSON ({exc})") from None
        except ValidationError as exc:
            err = exc.errors()[0]
            loc = ".".join(str(p) for p in err["loc"]) or "line"
            raise CorpusError(f"{path}:{line_no}: {loc}: {err['msg']}") from None
    if not records:
        raise CorpusError(f"--questions {path} holds no questions")
    return records


def load_questions(path: Path) -> list[Question]:
    """Every question of a jsonl file; a bad line is a CorpusError naming file:line."""
    return read_records(path, Question)
