"""Tokenizers: the character uni+bigram default on a table of scripts, and name lookup."""

from __future__ import annotations

import importlib.util

import pytest

from residency.errors import ConfigError
from residency.retrieval import CjkBigramTokenizer, SudachiTokenizer, get_tokenizer
from residency.retrieval.tokenize_ja import QUERY_WORD_WEIGHT

CASES = [
    pytest.param("東京都", ["東", "京", "都", "東京", "京都"], id="kanji"),
    pytest.param("ひらがな", ["ひ", "ら", "が", "な", "ひら", "らが", "がな"], id="hiragana"),
    pytest.param("コーヒー", ["コ", "ー", "ヒ", "ー", "コー", "ーヒ", "ヒー"], id="katakana-choon"),
    pytest.param("ｶﾀｶﾅ", ["カ", "タ", "カ", "ナ", "カタ", "タカ", "カナ"], id="halfwidth-kana"),
    pytest.param("人々", ["人", "々", "人々"], id="iteration-mark"),
    pytest.param(
        "東京タワー", ["東", "京", "タ", "ワ", "ー", "東京", "京タ", "タワ", "ワー"], id="mixed-run"
    ),
    pytest.param("GPUは2枚", ["gpu", "は", "2", "枚"], id="latin-digits-split-cjk"),
    pytest.param("ＧＰＵ１２３", ["gpu123"], id="fullwidth-ascii"),
    pytest.param("vLLM v0.6.3", ["vllm", "v0", "6", "3"], id="latin-punctuation"),
    pytest.param("snake_case", ["snake", "case"], id="underscore-splits"),
    pytest.param("Café Ωmega", ["café", "ωmega"], id="non-ascii-letters"),
    pytest.param(
        "「東京」、大阪。", ["東", "京", "東京", "大", "阪", "大阪"], id="cjk-punctuation"
    ),
    pytest.param(
        "コーヒー・ブレイク",
        [
            "コ",
            "ー",
            "ヒ",
            "ー",
            "コー",
            "ーヒ",
            "ヒー",
            "ブ",
            "レ",
            "イ",
            "ク",
            "ブレ",
            "レイ",
            "イク",
        ],
        id="nakaguro-splits",
    ),
    pytest.param("！？（）…　", [], id="only-punctuation"),
    pytest.param("", [], id="empty"),
]


@pytest.mark.parametrize(("text", "expected"), CASES)
def test_cjk_bigram_tokens(text: str, expected: list[str]) -> None:
    assert CjkBigramTokenizer().tokenize(text) == expected


def test_query_weights_other_words_only_beside_cjk_text() -> None:
    tokenizer = CjkBigramTokenizer()
    mixed = tokenizer.tokenize_query("RNAは何を")
    assert mixed.count("rna") == QUERY_WORD_WEIGHT > 1
    assert [t for t in mixed if t != "rna"] == [t for t in tokenizer.tokenize("は何を")]
    # An all-Latin query: weighting every term alike would rank the same, so it is left alone.
    assert tokenizer.tokenize_query("KV cache GPU") == tokenizer.tokenize("KV cache GPU")


def test_cjk_bigram_name_is_stable() -> None:
    # The name is recorded in index manifests: changing it invalidates every index.
    assert CjkBigramTokenizer.name == "cjk-bigram-v1"


def test_get_tokenizer_by_name() -> None:
    assert isinstance(get_tokenizer("cjk-bigram-v1"), CjkBigramTokenizer)


def test_unknown_tokenizer_lists_known_names() -> None:
    with pytest.raises(ConfigError, match=r"unknown tokenizer 'mecab'.*cjk-bigram-v1.*sudachi"):
        get_tokenizer("mecab")


@pytest.mark.skipif(importlib.util.find_spec("sudachipy") is not None, reason="sudachipy present")
def test_sudachi_missing_names_install_command() -> None:
    with pytest.raises(ConfigError, match=r"pip install 'residency\[sudachi\]'"):
        get_tokenizer("sudachi-c-normalized-v1")


@pytest.mark.skipif(
    importlib.util.find_spec("sudachipy") is None, reason="needs residency[sudachi]"
)
def test_sudachi_normalized_forms_without_punctuation() -> None:
    tokens = SudachiTokenizer().tokenize("附属病院に行った。")
    assert any("付属" in t for t in tokens)  # 附属 -> 付属: the normalised form
    assert "。" not in tokens
