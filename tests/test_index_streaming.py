"""The streaming index build writes the files the in-memory build wrote, byte for byte.

`reference_build` is the former `build_index` (every section, chunk and vector held at once,
bm25s indexing every document's token ids in one call, one FAISS index over one matrix), run on
the sample corpora and on a generated corpus of awkward text files big enough to span several
section, embedding and FAISS batches. The BM25 and dense writers are also compared with
`BM25Retriever.build(...).save` and `DenseRetriever.from_vectors(...).save` with tiny blocks.
"""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import orjson
import pytest
from hash_embedder import HashEmbedder
from pydantic import BaseModel

from residency.corpus.chunker_settings import ChunkerSettings
from residency.corpus.chunking import chunk_sections
from residency.corpus.loader import Corpus, load_corpus
from residency.corpus.samples import EN_SAMPLE, JA_SAMPLE, SampleCorpus
from residency.errors import CorpusError
from residency.index import IndexManifest, IndexOptions, build_index, open_index
from residency.retrieval import BM25Retriever, CjkBigramTokenizer, DenseRetriever, get_tokenizer
from residency.retrieval.bm25_build import Bm25Writer
from residency.retrieval.dense_build import DenseWriter, flat_layout_holds
from residency.tokenizer import ApproxTokenizer

EN_WORDS = ["the", "lamp", "keeper", "checked", "beacon", "tide", "signal", "storm", "cache"]
JA_WORDS = ["灯台", "の", "点検", "は", "毎朝", "記録", "蓄電池", "を", "交換", "する", "霧笛"]


def _jsonl(records: Sequence[BaseModel]) -> bytes:
    return b"".join(orjson.dumps(r.model_dump(mode="json")) + b"\n" for r in records)


def reference_build(
    corpus: Path, out: Path, options: IndexOptions, embedder: HashEmbedder | None
) -> Corpus:
    """The in-memory build (without its manifest): what `build_index` wrote before streaming."""
    loaded = load_corpus(corpus, ApproxTokenizer())
    chunker = options.chunker
    if chunker.kind == "semantic":
        chunker = chunker.model_copy(update={"embedder": options.embedder})
    chunks = chunk_sections(loaded.sections, chunker, embedder)
    out.mkdir()
    (out / "bm25").mkdir()
    tokenizer = get_tokenizer(options.sparse_tokenizer)
    ids, texts = [c.id for c in chunks], [c.index_text for c in chunks]
    BM25Retriever.build(ids, texts, tokenizer).save(out / "bm25")
    if options.dense:
        assert embedder is not None
        keys = list(dict.fromkeys(c.content_hash for c in chunks))
        text_of = {c.content_hash: c.index_text for c in reversed(chunks)}
        matrix = embedder.embed_passages([text_of[k] for k in keys])
        row = {k: i for i, k in enumerate(keys)}
        (out / "dense").mkdir()
        vectors = matrix[[row[c.content_hash] for c in chunks]]
        DenseRetriever.from_vectors(ids, vectors, embedder).save(out / "dense")
        np.save(out / "vectors.npy", matrix)
        (out / "vector_keys.json").write_bytes(orjson.dumps(keys))
    (out / "sections.jsonl").write_bytes(_jsonl(loaded.sections))
    (out / "chunks.jsonl").write_bytes(_jsonl(chunks))
    return loaded


def digests(directory: Path, skip: str = "manifest.json") -> dict[str, str]:
    """relpath -> sha256 of every file under `directory` (a readable diff when one differs)."""
    return {
        p.relative_to(directory).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file() and p.name != skip
    }


def assert_same_build(
    manifest: IndexManifest, built: Path, reference: Path, loaded: Corpus
) -> None:
    assert digests(built) == digests(reference)
    assert manifest.files == loaded.files
    assert manifest.skipped == loaded.skipped
    assert manifest.corpus_hash == loaded.corpus_hash
    assert manifest.section_count == len(loaded.sections)
    assert manifest.total_tokens == sum(s.token_count for s in loaded.sections)
    assert manifest.chunk_count == sum(1 for line in (built / "chunks.jsonl").open("rb"))


def paragraph(rng: np.random.Generator, most: int = 6) -> str:
    """Mixed English / Japanese sentences, 1 to `most` of them."""
    out = []
    for _ in range(int(rng.integers(1, most + 1))):
        if rng.random() < 0.5:
            out.append(" ".join(rng.choice(EN_WORDS, size=int(rng.integers(4, 16)))) + ".")
        else:
            out.append("".join(rng.choice(JA_WORDS, size=int(rng.integers(4, 16)))) + "。")
    return " ".join(out)


def awkward_corpus(root: Path, paragraphs: int = 2000, records: int = 600) -> Path:
    """Text files a streaming reader can get wrong: a BOM, CRLF, lone CR and U+2028 line ends,
    blank lines of spaces, a paragraph of ideographic spaces, no final newline, bad and
    duplicate .jsonl lines; enough of them for several section / embedding / FAISS batches."""
    rng = np.random.default_rng(33)
    root.mkdir(parents=True)
    head = "\ufeffFirst para\r\nline two\r\n\r\n  \t\r\nthird\u2028same para\rstill\n\n\n\u3000\n\n"
    body = "".join(
        paragraph(rng, 30) + "\n" + " " * int(rng.integers(0, 3)) + "\n" for _ in range(paragraphs)
    )
    (root / "notes.txt").write_text(head + body + "last, no newline", encoding="utf-8")
    lines = [
        orjson.dumps({"id": f"r{i}", "title": f"記録 {i % 7}", "text": paragraph(rng)}).decode()
        for i in range(records)
    ]
    lines[5] = '{"id": "bad", "text": '
    lines[9] = lines[3]  # a duplicate id
    (root / "log.jsonl").write_text("\r\n".join(lines) + "\r\n\r\n", encoding="utf-8")
    (root / "manual.md").write_text(
        "# 運用 {#ops}\n\n" + paragraph(rng) + "\n\n## 点検\n\n" + paragraph(rng) + "\n",
        encoding="utf-8",
    )
    return root


@pytest.mark.parametrize(
    ("sample", "dense"),
    [
        pytest.param(JA_SAMPLE, True, id="harbor-lights-dense"),
        pytest.param(EN_SAMPLE, False, id="harbor-lights-en-bm25"),
    ],
)
def test_sample_corpora_build_the_same_files(
    tmp_path: Path, sample: SampleCorpus, dense: bool
) -> None:
    docs = sample.docs
    options = IndexOptions(dense=dense, embedder=HashEmbedder.name)
    embedder = HashEmbedder()
    manifest = build_index(docs, tmp_path / "idx", options, ApproxTokenizer(), embedder=embedder)
    loaded = reference_build(docs, tmp_path / "ref", options, HashEmbedder())
    assert_same_build(manifest, tmp_path / "idx", tmp_path / "ref", loaded)


def test_an_awkward_corpus_builds_the_same_files_across_batches(tmp_path: Path) -> None:
    corpus = awkward_corpus(tmp_path / "docs")
    options = IndexOptions(embedder=HashEmbedder.name)
    embedder = HashEmbedder()
    manifest = build_index(corpus, tmp_path / "idx", options, ApproxTokenizer(), embedder=embedder)
    assert manifest.section_count > 1024  # three section batches
    assert manifest.chunk_count > 4096  # two FAISS batches
    assert max(embedder.calls) <= 256 < sum(embedder.calls)  # embedded in batches
    assert [(s.file, s.line) for s in manifest.skipped] == [("log.jsonl", 6), ("log.jsonl", 10)]
    loaded = reference_build(corpus, tmp_path / "ref", options, HashEmbedder())
    assert_same_build(manifest, tmp_path / "idx", tmp_path / "ref", loaded)
    index = open_index(tmp_path / "idx", embedder=embedder)
    assert index.search("蓄電池を交換", 1)[0].section_id.startswith(("notes#p", "r", "manual#"))


def test_a_reindex_reuses_files_and_vectors_and_builds_the_same_files(tmp_path: Path) -> None:
    corpus = awkward_corpus(tmp_path / "docs", paragraphs=300, records=100)
    rng = np.random.default_rng(1)
    (corpus / "keep.txt").write_text("\n\n".join(paragraph(rng, 30) for _ in range(200)), "utf-8")
    options = IndexOptions(embedder=HashEmbedder.name)
    build_index(corpus, tmp_path / "idx", options, ApproxTokenizer(), embedder=HashEmbedder())
    old_keys = set(orjson.loads((tmp_path / "idx/vector_keys.json").read_bytes()))
    text = (corpus / "notes.txt").read_text(encoding="utf-8")
    (corpus / "notes.txt").write_text(text.replace("First para", "An edited para"), "utf-8")
    (corpus / "manual.md").unlink()
    (corpus / "added.md").write_text("# 追加\n\n新しい霧笛の記録。\n", encoding="utf-8")
    again = build_index(
        corpus, tmp_path / "idx", options, ApproxTokenizer(), embedder=HashEmbedder()
    )
    # log.jsonl is read again too: one of its lines was skipped as a duplicate id.
    assert (again.build.parsed_files, again.build.reused_files) == (3, 1)
    assert again.build.removed_files == 1
    loaded = reference_build(corpus, tmp_path / "ref", options, HashEmbedder())
    assert_same_build(again, tmp_path / "idx", tmp_path / "ref", loaded)
    chunks = [orjson.loads(line) for line in (tmp_path / "ref/chunks.jsonl").open("rb")]
    assert again.build.embedded_chunks == sum(c["content_hash"] not in old_keys for c in chunks)
    assert 0 < again.build.embedded_chunks < again.build.reused_chunks


def test_semantic_chunks_are_the_same_when_sections_come_in_batches(tmp_path: Path) -> None:
    corpus = awkward_corpus(tmp_path / "docs", paragraphs=700, records=20)
    semantic = ChunkerSettings(kind="semantic", chunk_chars=64)
    options = IndexOptions(dense=False, chunker=semantic, embedder=HashEmbedder.name)
    manifest = build_index(
        corpus, tmp_path / "idx", options, ApproxTokenizer(), embedder=HashEmbedder()
    )
    assert manifest.section_count > 512
    assert manifest.build.embedded_sentences > 0
    loaded = reference_build(corpus, tmp_path / "ref", options, HashEmbedder())
    assert_same_build(manifest, tmp_path / "idx", tmp_path / "ref", loaded)


def _ids_file(path: Path, ids: Sequence[str]) -> Path:
    path.write_bytes(b"".join(orjson.dumps(i) + b"\n" for i in ids))
    return path


@pytest.mark.parametrize(
    ("block_pairs", "piece_pairs"),
    [
        pytest.param(1 << 23, 1 << 20, id="one-block"),
        pytest.param(300, 97, id="many-blocks-and-pieces"),
        pytest.param(1, 1000, id="a-column-per-block"),
    ],
)
def test_bm25_writer_writes_what_bm25s_writes(
    tmp_path: Path, block_pairs: int, piece_pairs: int
) -> None:
    rng = np.random.default_rng(5)
    texts = [paragraph(rng) for _ in range(400)] + ["", "。", "同じ 同じ 同じ"]
    ids = [f"doc-{i}" for i in range(len(texts))]
    tokenizer = CjkBigramTokenizer()
    (tmp_path / "ref").mkdir()
    BM25Retriever.build(ids, texts, tokenizer).save(tmp_path / "ref")
    (tmp_path / "spill").mkdir()
    (tmp_path / "out").mkdir()
    writer = Bm25Writer(
        tokenizer,
        tmp_path / "spill",
        flush_pairs=53,
        piece_pairs=piece_pairs,
        block_pairs=block_pairs,
    )
    for text in texts:
        writer.add(text)
    writer.write(tmp_path / "out", _ids_file(tmp_path / "ids", ids))
    assert digests(tmp_path / "out") == digests(tmp_path / "ref")
    assert list((tmp_path / "spill").iterdir()) == []  # the spill files are gone


def test_bm25_writer_refuses_no_documents_and_no_terms(tmp_path: Path) -> None:
    for texts, fragment in (([], "0 documents"), (["。", "!"], "no cjk-bigram-v1 terms")):
        spill = tmp_path / f"spill-{len(texts)}"
        spill.mkdir()
        writer = Bm25Writer(CjkBigramTokenizer(), spill)
        for text in texts:
            writer.add(text)
        with pytest.raises(CorpusError, match=fragment):
            writer.write(tmp_path, _ids_file(tmp_path / "ids", [str(i) for i in texts]))


@pytest.mark.parametrize(
    "threshold", [pytest.param(10_000, id="flat"), pytest.param(50, id="hnsw")]
)
def test_dense_writer_in_batches(tmp_path: Path, threshold: int) -> None:
    embedder = HashEmbedder()
    rng = np.random.default_rng(9)
    texts = [paragraph(rng) for _ in range(300)]
    ids = [f"c{i}" for i in range(len(texts))]
    vectors = embedder.embed_passages(texts) * 3.0  # not unit length: both re-normalise
    reference = DenseRetriever.from_vectors(ids, vectors, embedder, hnsw_threshold=threshold)
    (tmp_path / "ref").mkdir()
    reference.save(tmp_path / "ref")
    (tmp_path / "out").mkdir()
    writer = DenseWriter(tmp_path / "out", embedder, len(ids), hnsw_threshold=threshold)
    for start in range(0, len(ids), 64):
        writer.add(vectors[start : start + 64])
    writer.write(_ids_file(tmp_path / "ids", ids))
    loaded = DenseRetriever.load(tmp_path / "out", embedder)
    assert loaded.index_kind == reference.index_kind
    if threshold > len(ids):
        assert flat_layout_holds(embedder.dim)
        assert digests(tmp_path / "out") == digests(tmp_path / "ref")
    for row in (0, 123, 299):  # HNSW inserts batch by batch: the graph differs, not the answers
        assert loaded.search_vector(vectors[row], 1)[0].id == ids[row]


def test_dense_writer_counts_what_it_was_promised(tmp_path: Path) -> None:
    embedder = HashEmbedder()
    writer = DenseWriter(tmp_path, embedder, 2)
    writer.add(embedder.embed_passages(["a b", "c d"]))
    with pytest.raises(ValueError, match="3 vectors added, 2 announced"):
        writer.add(embedder.embed_passages(["e f"]))
    writer.close()
    short = DenseWriter(tmp_path, embedder, 2)
    short.add(embedder.embed_passages(["a b"]))
    with pytest.raises(ValueError, match="1 vectors added, 2 announced"):
        short.write(_ids_file(tmp_path / "ids", ["x"]))
    short.close()
    shutil.rmtree(tmp_path)
