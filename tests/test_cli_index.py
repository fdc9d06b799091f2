"""`residency index` and `residency corpus import-squad` as a user runs them (real processes)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from residency_cli import run_cli
from vllm_server import REPO_ROOT, VllmServer

from residency.index import open_index, read_manifest

SAMPLE = REPO_ROOT / "residency/data/corpora/harbor-lights/docs"
JSQUAD = REPO_ROOT.parent / "shared/data/jsquad/valid-v1.3.json"
CLI = [sys.executable, "-m", "residency"]


def tiny_corpus(root: Path, sections: int = 3) -> Path:
    root.mkdir(parents=True)
    body = "".join(f"## 節{i} {{#s{i}}}\n\n灯台{i}の点検を行う。\n\n" for i in range(sections))
    (root / "manual.md").write_text(f"# 手引き\n\n{body}", encoding="utf-8")
    return root


def build_dirs(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if ".building-" in p.name)


@pytest.mark.skipif(not SAMPLE.is_dir(), reason=f"sample corpus missing at {SAMPLE}")
def test_index_the_sample_corpus_bm25_only_json(tmp_path: Path) -> None:
    out = run_cli("index", str(SAMPLE), "-o", str(tmp_path / "idx"), "--no-dense", "--json")
    assert out.returncode == 0, out.stderr
    manifest = json.loads(out.stdout)
    assert manifest["index_dir"] == str((tmp_path / "idx").resolve())
    assert manifest["embedder"] is None
    assert manifest["skipped"] == []
    assert manifest["section_count"] > 50
    assert manifest["chunk_count"] >= manifest["section_count"]
    assert manifest["token_count"]["method"] == "approx"
    paths = {f["path"] for f in manifest["files"]}
    assert "notes/maintenance-2025.jsonl" in paths
    assert "faq.md" in paths
    idx = open_index(tmp_path / "idx")
    assert any(s.date is not None for s in idx.sections)  # dated notes keep their dates
    assert idx.search("灯器の日常点検", 5)


def test_index_prints_a_summary_and_lists_skipped_inputs(tmp_path: Path) -> None:
    corpus = tiny_corpus(tmp_path / "docs")
    (corpus / "broken.jsonl").write_text('{"id": "a", "text": "ok"}\n{"id": "b"}\n')
    (corpus / "slides.pptx").write_bytes(b"PK\x03\x04")
    out = run_cli("index", str(corpus), "-o", str(tmp_path / "idx"), "--no-dense")
    assert out.returncode == 0, out.stderr
    for fragment in ("sections", "chunks", "embedded", "reused", "skipped inputs", "approx"):
        assert fragment in out.stdout
    assert "broken.jsonl:2" in out.stdout
    assert "text: Field required" in out.stdout
    assert "unsupported file type '.pptx'" in out.stdout
    assert "token counts are approximate" in out.stdout


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        pytest.param(
            ["--chunk-overlap", "300"],
            "--chunk-overlap 300 must be smaller than --chunk-chars 256",
            id="overlap",
        ),
        pytest.param(["--sparse-tokenizer", "mecab"], "unknown tokenizer 'mecab'", id="tokenizer"),
        pytest.param(["--strict"], "--strict: 1 input(s) would be skipped", id="strict"),
        pytest.param(["--tokenizer-dir", "."], "no tokenizer.json", id="tokenizer-dir"),
    ],
)
def test_index_errors_are_one_line_and_write_nothing(
    tmp_path: Path, extra: list[str], fragment: str
) -> None:
    corpus = tiny_corpus(tmp_path / "docs")
    (corpus / "empty.txt").write_text("")
    out = run_cli("index", str(corpus), "-o", str(tmp_path / "idx"), "--no-dense", *extra)
    assert out.returncode == 1
    assert fragment in out.stderr
    assert "Traceback" not in out.stderr
    assert not (tmp_path / "idx").exists()


def test_an_empty_corpus_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs/blank.md").write_text("\n\n")
    out = run_cli("index", str(tmp_path / "docs"), "-o", str(tmp_path / "idx"), "--no-dense")
    assert out.returncode == 1
    assert "has no sections" in out.stderr
    assert "blank.md: empty file" in out.stderr


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize(
    ("sig", "stale_left"),
    [
        pytest.param(signal.SIGTERM, False, id="sigterm-cleans-up"),
        pytest.param(signal.SIGINT, False, id="ctrl-c-cleans-up"),
        pytest.param(signal.SIGKILL, True, id="sigkill-leaves-an-ignored-temp-dir"),
    ],
)
def test_a_killed_build_keeps_the_old_index(
    tmp_path: Path, sig: signal.Signals, stale_left: bool
) -> None:
    corpus = tiny_corpus(tmp_path / "docs", sections=60)
    index = tmp_path / "idx"
    first = run_cli("index", str(corpus), "-o", str(index), "--no-dense")
    assert first.returncode == 0, first.stderr
    before = (index / "manifest.json").read_bytes()
    # The dense rebuild embeds 60 chunks (seconds); kill it as soon as its temp dir exists.
    proc = subprocess.Popen(
        [*CLI, "index", str(corpus), "-o", str(index)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # A shell's background job starts with SIGINT ignored, and Python keeps an ignored
        # SIGINT ignored: give the CLI the disposition a terminal gives it.
        preexec_fn=_default_sigint,
    )
    deadline = time.monotonic() + 60
    while not build_dirs(tmp_path) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert proc.poll() is None, f"the build ended before it could be killed: {proc.stderr}"
    proc.send_signal(sig)
    proc.communicate(timeout=60)
    # SIGTERM and Ctrl-C unwind (exit 130, like click's Abort); SIGKILL cannot be caught.
    assert proc.returncode == (-signal.SIGKILL if sig == signal.SIGKILL else 130)
    assert (index / "manifest.json").read_bytes() == before
    assert open_index(index).manifest.embedder is None  # still the old, BM25-only index
    assert bool(build_dirs(tmp_path)) is stale_left
    # The next build removes a dead build's temp dir.
    again = run_cli("index", str(corpus), "-o", str(index), "--no-dense")
    assert again.returncode == 0, again.stderr
    assert build_dirs(tmp_path) == []


def test_import_squad_cli_refuses_a_non_empty_outdir(tmp_path: Path) -> None:
    squad = {
        "data": [
            {
                "title": "灯台",
                "paragraphs": [
                    {
                        "context": "灯台 [SEP] 灯台は光で船を導く。",
                        "qas": [
                            {"id": "q", "question": "灯台は何で導く?", "answers": [{"text": "光"}]}
                        ],
                    }
                ],
            }
        ]
    }
    src = tmp_path / "squad.json"
    src.write_text(json.dumps(squad, ensure_ascii=False), encoding="utf-8")
    out = run_cli("corpus", "import-squad", str(src), str(tmp_path / "out"))
    assert out.returncode == 0, out.stderr
    assert "1 articles, 1 paragraphs" in out.stdout
    assert "residency index" in out.stdout
    again = run_cli("corpus", "import-squad", str(src), str(tmp_path / "out"))
    assert again.returncode == 1
    assert "exists and is not empty; pass --force" in again.stderr
    forced = run_cli("corpus", "import-squad", str(src), str(tmp_path / "out"), "--force", "--json")
    assert forced.returncode == 0, forced.stderr
    assert json.loads(forced.stdout)["questions"] == 1


@pytest.mark.skipif(not JSQUAD.is_file(), reason=f"JSQuAD v1.3 valid not found at {JSQUAD}")
def test_jsquad_import_index_eval_end_to_end_bm25(tmp_path: Path) -> None:
    out = tmp_path / "jsquad"
    assert run_cli("corpus", "import-squad", str(JSQUAD), str(out)).returncode == 0
    built = run_cli("index", str(out), "-o", str(tmp_path / "idx"), "--no-dense")
    assert built.returncode == 0, built.stderr
    ev = run_cli(
        "eval",
        "retrieval",
        "--index",
        str(tmp_path / "idx"),
        "--questions",
        str(tmp_path / "jsquad.qa.jsonl"),
        "--json",
    )
    assert ev.returncode == 0, ev.stderr
    report = json.loads(ev.stdout)
    assert report["evaluated"] == 4442
    bm25 = report["retrievers"]["bm25"]["overall"]
    # docs/design/retrieval.md: NFKC + character uni+bigrams reach R@1 .908, R@10 .979 on whole
    # paragraphs.
    assert bm25["recall_at_1"] > 0.88
    assert bm25["recall_at_10"] > 0.96


@pytest.mark.vllm
def test_index_counts_tokens_with_a_running_vllm(
    tmp_path: Path, vllm_dense_server: VllmServer, dense_model_dir: Path
) -> None:
    corpus = tiny_corpus(tmp_path / "docs")
    by_server = run_cli(
        "index",
        str(corpus),
        "-o",
        str(tmp_path / "a"),
        "--no-dense",
        "--server",
        vllm_dense_server.base_url,
        "--json",
    )
    assert by_server.returncode == 0, by_server.stderr
    local = run_cli(
        "index",
        str(corpus),
        "-o",
        str(tmp_path / "b"),
        "--no-dense",
        "--tokenizer-dir",
        str(dense_model_dir),
        "--json",
    )
    assert local.returncode == 0, local.stderr
    a, b = read_manifest(tmp_path / "a"), read_manifest(tmp_path / "b")
    assert (a.token_count.method, b.token_count.method) == ("server", "tokenizer")
    assert a.total_tokens == b.total_tokens > 0
