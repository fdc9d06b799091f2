"""SQuAD-style import: corpus files, questions, provenance, and refusing to clobber a directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from residency.corpus.loader import load_corpus
from residency.corpus.squad import import_squad, split_context
from residency.errors import ConfigError, CorpusError
from residency.tokenizer import ApproxTokenizer

JSQUAD = Path(__file__).resolve().parents[2] / "shared/data/jsquad/valid-v1.3.json"

SQUAD = {
    "version": "v1.3",
    "data": [
        {
            "title": "梅雨",
            "paragraphs": [
                {
                    "context": "梅雨 [SEP] 梅雨は雨季の一種である。",
                    "qas": [
                        {
                            "id": "q1",
                            "question": "梅雨とは何季の一種か?",
                            "answers": [
                                {"text": "雨季", "answer_start": 8},
                                {"text": "雨季の一種", "answer_start": 8},
                            ],
                            "is_impossible": False,
                        }
                    ],
                },
                {"context": "梅雨 [SEP] 5月から7月にかけて雨が多い。", "qas": []},
            ],
        },
        {
            "title": "Google 検索",
            "paragraphs": [
                {
                    "context": "Google 検索 [SEP] 検索エンジンである。",
                    "qas": [
                        {"id": "q2", "question": "何か?", "answers": [], "is_impossible": True}
                    ],
                }
            ],
        },
        {
            "title": "梅雨",
            "paragraphs": [{"context": "同名の記事 [SEP] 別の本文。", "qas": []}],
        },
    ],
}


def read_jsonl(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


@pytest.fixture
def squad_file(tmp_path: Path) -> Path:
    path = tmp_path / "squad.json"
    path.write_text(json.dumps(SQUAD, ensure_ascii=False), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("context", "title", "text"),
    [
        pytest.param("梅雨 [SEP] 本文。", "梅雨", "本文。", id="title-sep-text"),
        pytest.param("本文だけ。", "梅雨", "本文だけ。", id="no-sep"),
        pytest.param("別題 [SEP] 本文。", "梅雨", "別題 [SEP] 本文。", id="other-title-kept"),
    ],
)
def test_split_context(context: str, title: str, text: str) -> None:
    assert split_context(context, title) == text


def test_import_writes_a_corpus_and_questions(squad_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    report = import_squad(squad_file, out)
    assert (report.articles, report.paragraphs, report.questions, report.unanswerable) == (
        3,
        4,
        2,
        1,
    )
    assert sorted(p.name for p in out.iterdir()) == [  # the corpus, nothing else
        "google-検索.jsonl",
        "梅雨-2.jsonl",
        "梅雨.jsonl",
    ]
    assert read_jsonl(out / "梅雨.jsonl") == [
        {"id": "梅雨-p1", "title": "梅雨", "text": "梅雨は雨季の一種である。"},
        {"id": "梅雨-p2", "title": "梅雨", "text": "5月から7月にかけて雨が多い。"},
    ]
    beside = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("out"))
    assert beside == ["out", "out.import.json", "out.qa.jsonl"]
    assert read_jsonl(tmp_path / "out.qa.jsonl") == [
        {
            "id": "q1",
            "query": "梅雨とは何季の一種か?",
            "relevant_ids": ["梅雨-p1"],
            "type": "squad",
            "answer": "雨季",
        },
        {"id": "q2", "query": "何か?", "relevant_ids": [], "type": "unknown", "answer": ""},
    ]
    provenance = json.loads((tmp_path / "out.import.json").read_text())
    assert provenance["source_file"] == str(squad_file.resolve())
    assert len(provenance["source_sha256"]) == 64
    # the written corpus loads cleanly, with the ids the questions point at
    corpus = load_corpus(out, ApproxTokenizer())
    assert corpus.skipped == ()
    assert {s.id for s in corpus.sections} >= {"梅雨-p1", "梅雨-2-p1", "google-検索-p1"}


def test_a_non_empty_outdir_is_refused_unless_forced(squad_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(ConfigError, match="exists and is not empty; pass --force"):
        import_squad(squad_file, out)
    assert (out / "keep.txt").read_text() == "mine"
    import_squad(squad_file, out, force=True)
    assert not (out / "keep.txt").exists()  # replaced whole
    assert (tmp_path / "out.qa.jsonl").is_file()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_questions_beside_the_corpus_are_not_replaced_unless_forced(
    squad_file: Path, tmp_path: Path
) -> None:
    (tmp_path / "out.qa.jsonl").write_text("mine\n")
    with pytest.raises(ConfigError, match=r"out\.qa\.jsonl exists; pass --force"):
        import_squad(squad_file, tmp_path / "out")
    assert (tmp_path / "out.qa.jsonl").read_text() == "mine\n"
    import_squad(squad_file, tmp_path / "out", force=True)
    assert len(read_jsonl(tmp_path / "out.qa.jsonl")) == 2


def test_an_empty_outdir_is_used(squad_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    assert import_squad(squad_file, out).paragraphs == 4


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        pytest.param("{not json", "invalid JSON", id="invalid-json"),
        pytest.param('{"data": []}', "data: ", id="no-articles"),
        pytest.param('{"data": [{"title": "t"}]}', "data.0.paragraphs", id="no-paragraphs-key"),
    ],
)
def test_bad_squad_files_name_the_file(tmp_path: Path, content: str, fragment: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(CorpusError, match=fragment) as info:
        import_squad(path, tmp_path / "out")
    assert str(path) in str(info.value)
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(not JSQUAD.is_file(), reason=f"JSQuAD v1.3 valid not found at {JSQUAD}")
def test_jsquad_valid_imports_whole(tmp_path: Path) -> None:
    report = import_squad(JSQUAD, tmp_path / "jsquad")
    assert (report.articles, report.paragraphs, report.questions) == (59, 1145, 4442)
    first = read_jsonl(tmp_path / "jsquad.qa.jsonl")[0]
    assert first["relevant_ids"] == ["梅雨-p1"]
    assert first["answer"] == "小笠原諸島"
    paragraph = read_jsonl(tmp_path / "jsquad/梅雨.jsonl")[0]
    assert str(paragraph["text"]).startswith("梅雨（つゆ、ばいう）は、")
