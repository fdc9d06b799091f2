"""SQuAD-style JSON (e.g. JSQuAD) into a corpus directory and a questions file beside it.

Output: the corpus directory holds the corpus and nothing else (written into a temp dir and
swapped in whole), so indexing it reads no question as a broken record; the questions and the
provenance sit beside it, named after it::

    OUTDIR/<article-slug>.jsonl   one section per paragraph: id '<slug>-p<N>', title, text
    OUTDIR.qa.jsonl               id, query, relevant_ids [gold paragraph], type, answer
    OUTDIR.import.json            provenance: source file and hash, counts

JSQuAD contexts read "title [SEP] text": the title goes to the record's ``title`` and only the
text to ``text``. A question without answers (``is_impossible``) gets type "unknown" and no
relevant ids; answerable ones get type "squad". Index ``OUTDIR``, evaluate with
``OUTDIR.qa.jsonl``.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from residency.atomic import atomic_directory, write_bytes_atomic
from residency.corpus.loader import slugify
from residency.errors import ConfigError, CorpusError

SEP = " [SEP] "
MAX_SLUG_CHARS = 80


class SquadAnswer(BaseModel):
    """An answer span (only the text is used)."""

    model_config = ConfigDict(frozen=True, extra="ignore", defer_build=True)

    text: str = Field(max_length=100_000, description="Answer text.")


class SquadQuestion(BaseModel):
    """One question of a paragraph."""

    model_config = ConfigDict(frozen=True, extra="ignore", defer_build=True)

    id: str = Field(min_length=1, max_length=1024, description="Question id.")
    question: str = Field(min_length=1, max_length=100_000, description="Question text.")
    answers: tuple[SquadAnswer, ...] = Field(default=(), description="Gold answers.")
    is_impossible: bool = Field(default=False, description="SQuAD 2.0: no answer.")


class SquadParagraph(BaseModel):
    """A context paragraph with its questions."""

    model_config = ConfigDict(frozen=True, extra="ignore", defer_build=True)

    context: str = Field(min_length=1, max_length=10_000_000, description="Paragraph text.")
    qas: tuple[SquadQuestion, ...] = Field(default=(), description="Questions on it.")


class SquadArticle(BaseModel):
    """An article: title and paragraphs."""

    model_config = ConfigDict(frozen=True, extra="ignore", defer_build=True)

    title: str = Field(max_length=1024, description="Article title.")
    paragraphs: tuple[SquadParagraph, ...] = Field(description="Its paragraphs.")


class SquadFile(BaseModel):
    """The top level of a SQuAD-format file."""

    model_config = ConfigDict(frozen=True, extra="ignore", defer_build=True)

    data: tuple[SquadArticle, ...] = Field(min_length=1, description="Articles.")


class SquadImportReport(BaseModel):
    """What an import wrote (also OUTDIR.import.json)."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    source_file: str = Field(min_length=1, max_length=4096, description="The SQuAD file read.")
    source_sha256: str = Field(min_length=64, max_length=64, description="Its sha256.")
    out_dir: str = Field(min_length=1, max_length=4096, description="Corpus written here.")
    articles: int = Field(ge=1, description="Articles (= .jsonl files in the corpus).")
    paragraphs: int = Field(ge=1, description="Paragraphs (= sections).")
    questions: int = Field(ge=0, description="Lines of OUTDIR.qa.jsonl.")
    unanswerable: int = Field(ge=0, description="Questions without an answer (type unknown).")


def questions_file(corpus_dir: Path) -> Path:
    """Where an import puts the questions of `corpus_dir`: beside it, ``<name>.qa.jsonl``."""
    return corpus_dir.with_name(corpus_dir.name + ".qa.jsonl")


def provenance_file(corpus_dir: Path) -> Path:
    """Where an import records what it read: beside the corpus, ``<name>.import.json``."""
    return corpus_dir.with_name(corpus_dir.name + ".import.json")


def split_context(context: str, title: str) -> str:
    """The paragraph text of a 'title [SEP] text' context (the whole context without [SEP]).

    >>> split_context("梅雨 [SEP] 梅雨は雨季の一種である。", "梅雨")
    '梅雨は雨季の一種である。'
    """
    head, sep, rest = context.partition(SEP)
    if sep and (head.strip() == title.strip() or not title):
        return rest.strip()
    return context.strip()


def read_squad(path: Path) -> SquadFile:
    """Parse a SQuAD-format JSON file; CorpusError naming the file on any problem."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"SQuAD file {path}: cannot read ({exc.strerror})") from None
    try:
        return SquadFile.model_validate(orjson.loads(data))
    except orjson.JSONDecodeError as exc:
        raise CorpusError(f"SQuAD file {path}: invalid JSON ({exc})") from None
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        raise CorpusError(f"SQuAD file {path}: {loc}: {err['msg']}") from None


def _slugs(titles: list[str]) -> list[str]:
    """A unique file-name slug per article ('-2', '-3' for repeated titles)."""
    used: set[str] = set()
    out = []
    for i, title in enumerate(titles, start=1):
        base = slugify(title)[:MAX_SLUG_CHARS] if title.strip() else f"article-{i}"
        slug, n = base, 2
        while slug in used:
            slug, n = f"{base}-{n}", n + 1
        used.add(slug)
        out.append(slug)
    return out


def import_squad(source: Path, out_dir: Path, *, force: bool = False) -> SquadImportReport:
    """Write `source` as a corpus + questions under `out_dir` (refuses a non-empty one unless
    `force`, which replaces it whole)."""
    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigError(f"OUTDIR {out_dir} is a file; pass a directory")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not force:
        raise ConfigError(f"OUTDIR {out_dir} exists and is not empty; pass --force to replace it")
    qa_file, provenance = questions_file(out_dir), provenance_file(out_dir)
    for beside in (qa_file, provenance):
        if beside.exists() and not force:
            raise ConfigError(f"{beside} exists; pass --force to replace it")
    squad = read_squad(source)
    slugs = _slugs([a.title for a in squad.data])
    paragraphs = questions = unanswerable = 0
    qa_lines: list[bytes] = []
    with atomic_directory(out_dir) as tmp:
        docs = tmp
        for article, slug in zip(squad.data, slugs, strict=True):
            lines = []
            for n, para in enumerate(article.paragraphs, start=1):
                pid = f"{slug}-p{n}"
                text = split_context(para.context, article.title)
                lines.append(orjson.dumps({"id": pid, "title": article.title, "text": text}))
                for qa in para.qas:
                    answers = [a.text for a in qa.answers if a.text.strip()]
                    answerable = bool(answers) and not qa.is_impossible
                    unanswerable += not answerable
                    record = {
                        "id": qa.id,
                        "query": qa.question,
                        "relevant_ids": [pid] if answerable else [],
                        "type": "squad" if answerable else "unknown",
                        "answer": answers[0] if answerable else "",
                    }
                    qa_lines.append(orjson.dumps(record))
                paragraphs += 1
                questions += len(para.qas)
            if lines:
                (docs / f"{slug}.jsonl").write_bytes(b"\n".join(lines) + b"\n")
        if paragraphs == 0:
            raise CorpusError(f"SQuAD file {source} has no paragraphs")
        report = SquadImportReport(
            source_file=str(source.resolve()),
            source_sha256=hashlib.sha256(source.read_bytes()).hexdigest(),
            out_dir=str(out_dir.resolve()),
            articles=sum(1 for a in squad.data if a.paragraphs),
            paragraphs=paragraphs,
            questions=questions,
            unanswerable=unanswerable,
        )
    write_bytes_atomic(qa_file, b"".join(line + b"\n" for line in qa_lines))
    payload = orjson.dumps(report.model_dump(mode="json"), option=orjson.OPT_INDENT_2)
    write_bytes_atomic(provenance, payload)  # last: its presence means a complete import
    return report
